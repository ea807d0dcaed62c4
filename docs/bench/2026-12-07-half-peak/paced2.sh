#!/bin/bash
# paced2.sh NAME RUNROOT: a paced phase at $RATE msg/s with the system's directory (the mocks' ledgers, the logs) under RUNROOT
D=/tmp/cs/$1; rm -rf $D; mkdir -p $D; R=$2/$1-run; rm -rf $R
timeout 900 /tmp/bin0/midflight-lab bench --mysql-url mysql://root@127.0.0.1:3306/test --systems midflight-mariadb --phases ${PHASES:-paced} --rate ${RATE:-600} --seconds 40 --ceiling-seconds 1 --run-dir $R --out $D/r > $D/run.log 2>&1
du -sh $R > $D/rundir-size.txt; rm -rf $R
