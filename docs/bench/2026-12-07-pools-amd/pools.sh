#!/bin/bash
# usage: pools.sh BIN DIR PHASE RATE POOL   (PHASE peak|paced|rebalance; RATE ignored at peak;
# POOL 16 is the lab's own, anything else is passed as database.max_connections to every consumer)
# In a 10 s window 22 s after the consumers are up: perf stat on each role (as sys.sh of
# 2026-12-07-syscalls), SHOW GLOBAL STATUS before and after, and a flat cpu-clock profile of mariadbd.
BIN=$1; D=$2; PHASE=$3; RATE=$4; POOL=$5
mkdir -p $D
EXTRA=""; [ "$PHASE" != peak ] && EXTRA="--rate $RATE"
[ "$POOL" != 16 ] && EXTRA="$EXTRA --consumer-set database.max_connections=$POOL"
echo "$BIN/midflight-lab bench ... --phases $PHASE $EXTRA" > $D/cmd.txt
$BIN/midflight-lab bench --mysql-url mysql://root@127.0.0.1:3306/test --systems midflight-mariadb --phases $PHASE $EXTRA --seconds 40 --ceiling-seconds 1 --run-dir $D/run --out $D/r > $D/lab.log 2>&1 &
LAB=$!
for i in $(seq 1 600); do
  W=$(pgrep -f "$BIN/mock-wms" | head -1); L=$(pgrep -f "$BIN/mock-logistics" | head -1); C=$(pgrep -f "$BIN/consumer" | paste -sd,)
  [ -n "$W" ] && [ -n "$L" ] && [ $(echo $C | tr , ' ' | wc -w) -ge 2 ] && break
  sleep 0.5
done
sleep 22
M=$(pgrep mariadbd); LP=$(pgrep -f "$BIN/midflight-lab" | head -1)
EV=raw_syscalls:sys_enter,context-switches,task-clock
mariadb -uroot -N -e 'show global status' > $D/status0.txt
perf stat -x, -e $EV -p $W,$L -o $D/stat-mocks.txt -- sleep 10 &
perf stat -x, -e $EV -p $C -o $D/stat-consumers.txt -- sleep 10 &
perf stat -x, -e $EV -p $M -o $D/stat-mariadb.txt -- sleep 10 &
perf stat -x, -e $EV -p $LP -o $D/stat-lab.txt -- sleep 10 &
perf stat -x, -e $EV -a -o $D/stat-all.txt -- sleep 10 &
perf record -q -e cpu-clock -F 499 -p $M -o $D/mariadb.perf -- sleep 10 2> $D/perf.err &
wait %2 %3 %4 %5 %6 %7 2>/dev/null
mariadb -uroot -N -e 'show global status' > $D/status1.txt
wait $LAB
echo "lab rc=$?" > $D/done.txt
