#!/bin/bash
# usage: sys.sh BIN DIR PHASE RATE   (PHASE paced|peak)
BIN=$1; D=$2; PHASE=$3; RATE=$4
mkdir -p $D
EXTRA=""; [ "$PHASE" = paced ] && EXTRA="--rate $RATE"
$BIN/midflight-lab bench --mysql-url mysql://root@127.0.0.1:3306/test --systems midflight-mariadb --phases $PHASE $EXTRA --seconds 40 --ceiling-seconds 1 --run-dir $D/run --out $D/r $5 > $D/lab.log 2>&1 &
LAB=$!
for i in $(seq 1 600); do
  W=$(pgrep -f "$BIN/mock-wms" | head -1); L=$(pgrep -f "$BIN/mock-logistics" | head -1); C=$(pgrep -f "$BIN/consumer" | paste -sd,)
  [ -n "$W" ] && [ -n "$L" ] && [ $(echo $C | tr , ' ' | wc -w) -ge 2 ] && break
  sleep 0.5
done
sleep 22
M=$(pgrep mariadbd); LP=$(pgrep -f "$BIN/midflight-lab" | head -1)
EV=raw_syscalls:sys_enter,context-switches,task-clock
perf stat -x, -e $EV -p $W,$L -o $D/stat-mocks.txt -- sleep 10 &
perf stat -x, -e $EV -p $C -o $D/stat-consumers.txt -- sleep 10 &
perf stat -x, -e $EV -p $M -o $D/stat-mariadb.txt -- sleep 10 &
perf stat -x, -e $EV -p $LP -o $D/stat-lab.txt -- sleep 10 &
perf stat -x, -e $EV -a -o $D/stat-all.txt -- sleep 10 &
wait %2 %3 %4 %5 %6 2>/dev/null
wait $LAB
echo "lab rc=$?" > $D/done.txt
