#!/bin/bash
# usage: run.sh BIN DIR RATE
BIN=$1; D=$2; RATE=$3
mkdir -p $D
$BIN/midflight-lab bench --mysql-url mysql://root@127.0.0.1:3306/test --systems midflight-mariadb --phases paced --rate $RATE --seconds 40 --ceiling-seconds 1 --run-dir $D/run --out $D/r > $D/lab.log 2>&1 &
LAB=$!
# wait for the mocks
for i in $(seq 1 600); do
  W=$(pgrep -f "$BIN/mock-wms" | head -1); L=$(pgrep -f "$BIN/mock-logistics" | head -1); C=$(pgrep -f "$BIN/consumer" | tr '\n' ' ')
  [ -n "$W" ] && [ -n "$L" ] && [ $(echo $C | wc -w) -ge 2 ] && break
  sleep 0.5
done
sleep 22
snap() { for p in $W $L $C $(pgrep mariadbd); do echo "$p $(awk '{print $14+$15}' /proc/$p/stat) $(grep -h ctxt /proc/$p/task/*/status | awk '{s+=$2} END {print s}')"; done; }
snap > $D/snap0.txt
if [ "$4" = perf ]; then perf record -F 999 -g -o $D/mocks.perf -p $W,$L -- sleep 10 2> $D/perf.err; else sleep 10; fi
snap > $D/snap1.txt
echo "W=$W L=$L C=$C" > $D/pids.txt
wait $LAB
echo lab rc=$? >> $D/pids.txt
