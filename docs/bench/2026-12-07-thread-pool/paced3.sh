#!/bin/bash
# paced3.sh NAME: a phase ($PHASES, default paced at $RATE msg/s) with sched.py reading run-queue waits 25-40 s after both consumers start
D=/tmp/cs/$1; rm -rf $D; mkdir -p $D; R=/tmp/cs/$1-run; rm -rf $R
python3 /tmp/cs/sched.py 25 15 > $D/sched.txt &
timeout 900 /tmp/bin0/midflight-lab bench --mysql-url mysql://root@127.0.0.1:3306/test --systems midflight-mariadb --phases ${PHASES:-paced} --rate ${RATE:-600} --seconds 40 --ceiling-seconds 1 --run-dir $R --out $D/r > $D/run.log 2>&1
wait; rm -rf $R
