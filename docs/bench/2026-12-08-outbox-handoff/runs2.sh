#!/bin/bash
# The second series, after the handed rows' claim was made short (5 s, extended for a long
# delivery): "short" is a release build of it (/tmp/binF), "old" the build of the commit before
# the handoff (/tmp/binO), as in runs.sh. Then the three kill scenarios with the short claim.
H=$(cd $(dirname $0) && pwd); C=$H/../2026-12-07-progress-count/count.sh
R=/tmp/oh; mkdir -p $R; cd $R
$C /tmp/binO peak-old3 peak 0 40 22
$C /tmp/binF peak-short1 peak 0 40 22
$C /tmp/binF peak-short2 peak 0 40 22
$C /tmp/binO peak-old4 peak 0 40 22
$C /tmp/binF paced-short1 paced 600 40 20
$C /tmp/binO paced-old3 paced 600 40 20
$C /tmp/binO paced-old4 paced 600 40 20
$C /tmp/binF paced-short2 paced 600 40 20
$H/../2026-12-07-pools-amd/slowlog.sh /tmp/binF $R/diag-short
for s in recovery-races-consumer kill-after-lock-sent rebalance-storm; do
  for n in short1 short2; do
    /tmp/binF/midflight-lab scenario $s --run-dir $R/scen/$s-$n --report-json $H/scenario-$s-$n.json > $R/$s-$n.log 2>&1
    echo "$s $n rc=$?"
  done
done
