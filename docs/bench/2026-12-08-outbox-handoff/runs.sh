#!/bin/bash
# The runs of this directory, in order (nothing else running). "new" ("long" in BENCHMARKS.md) is a release build of the
# handoff (/tmp/binN), "old" of the commit before it (/tmp/binO). Each run is one bench phase
# with SHOW GLOBAL STATUS and mariadbd's CPU read over a 10 s window (../2026-12-07-progress-count/count.sh).
H=$(cd $(dirname $0) && pwd); C=$H/../2026-12-07-progress-count/count.sh
R=/tmp/oh; mkdir -p $R; cd $R   # copied into this directory afterwards, without the systems' run/ directories
$C /tmp/binN peak-new1 peak 0 40 22
$C /tmp/binO peak-old1 peak 0 40 22
$C /tmp/binO peak-old2 peak 0 40 22
$C /tmp/binN peak-new2 peak 0 40 22
$C /tmp/binO paced-old1 paced 600 40 20
$C /tmp/binN paced-new1 paced 600 40 20
$C /tmp/binN paced-new2 paced 600 40 20
$C /tmp/binO paced-old2 paced 600 40 20
