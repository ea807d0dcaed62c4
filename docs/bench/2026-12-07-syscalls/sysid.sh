#!/bin/bash
# usage: sysid.sh BIN DIR PHASE RATE : records syscall ids per process for 5 s, 22 s into the phase
BIN=$1; D=$2; PHASE=$3; RATE=$4
mkdir -p $D
EXTRA=""; [ "$PHASE" = paced ] && EXTRA="--rate $RATE"
$BIN/midflight-lab bench --mysql-url mysql://root@127.0.0.1:3306/test --systems midflight-mariadb --phases $PHASE $EXTRA --seconds 40 --ceiling-seconds 1 --run-dir $D/run --out $D/r > $D/lab.log 2>&1 &
LAB=$!
for i in $(seq 1 600); do
  W=$(pgrep -f "$BIN/mock-wms" | head -1); L=$(pgrep -f "$BIN/mock-logistics" | head -1); C=$(pgrep -f "$BIN/consumer" | paste -sd,)
  [ -n "$W" ] && [ -n "$L" ] && [ $(echo $C | tr , ' ' | wc -w) -ge 2 ] && break
  sleep 0.5
done
sleep 22
M=$(pgrep mariadbd)
perf record -e raw_syscalls:sys_enter -p $W,$L,$C,$M -o $D/sys.perf -- sleep 5 2> $D/perf.err
wait $LAB
perf script -i $D/sys.perf -F comm,pid,trace 2>/dev/null | awk '{split($0,a,"NR "); split(a[2],b," "); print $1, b[1]}' | sort | uniq -c | sort -rn > $D/sysids.txt
echo "W=$W L=$L C=$C M=$M" > $D/pids.txt
