#!/bin/bash
# Half of today's peak (2,324-2,419 msg/s for the old build): paced at 1,150 msg/s, the final
# build (/tmp/binZ, bc67e7c) and the old one (/tmp/binO, c08461b) alternating, through count.sh.
H=$(cd $(dirname $0) && pwd); C=$H/../2026-12-07-progress-count/count.sh
R=/tmp/oh; mkdir -p $R; cd $R
$C /tmp/binZ half-final1 paced 1150 40 20
$C /tmp/binO half-old1 paced 1150 40 20
$C /tmp/binO half-old2 paced 1150 40 20
$C /tmp/binZ half-final2 paced 1150 40 20
# A second pair of pairs, after the first showed the final build with smaller groups.
$C /tmp/binO half-old3 paced 1150 40 20
$C /tmp/binZ half-final3 paced 1150 40 20
$C /tmp/binZ half-final4 paced 1150 40 20
$C /tmp/binO half-old4 paced 1150 40 20
