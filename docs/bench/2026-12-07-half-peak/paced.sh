#!/bin/bash
# paced.sh NAME NICE: a paced phase at 1,000 msg/s; with NICE, the two mocks are reniced to it as soon as they start
D=/tmp/cs/$1; rm -rf $D; mkdir -p $D
if [ -n "$2" ]; then
  ( for i in $(seq 1 600); do p=$(pgrep -x 'mock-wms|mock-logistics' | wc -l); if [ "$p" -ge 2 ]; then renice -n $2 -p $(pgrep -x 'mock-wms|mock-logistics') > $D/renice.txt; break; fi; sleep 0.2; done ) &
fi
timeout 900 /tmp/bin0/midflight-lab bench --mysql-url mysql://root@127.0.0.1:3306/test --systems midflight-mariadb --phases paced --rate ${RATE:-1000} --seconds 40 --ceiling-seconds 1 --run-dir $D/run --out $D/r > $D/run.log 2>&1
wait
