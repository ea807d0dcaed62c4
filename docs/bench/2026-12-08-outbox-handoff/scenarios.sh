#!/bin/bash
# Three scenarios with a kill -9 of a consumer, old and new binaries alternating; each report's
# seconds_to_quiescence counts until every saga is terminal and every notification published.
R=/tmp/oh/scen; mkdir -p $R
H=$(cd $(dirname $0) && pwd)
for s in recovery-races-consumer kill-after-lock-sent rebalance-storm; do
  for b in new1:binN old1:binO old2:binO new2:binN; do
    n=${b%%:*}; bin=/tmp/${b##*:}
    $bin/midflight-lab scenario $s --run-dir $R/$s-$n --report-json $H/scenario-$s-$n.json > $R/$s-$n.log 2>&1
    echo "$s $n rc=$?"
  done
done
