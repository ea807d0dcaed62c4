#!/bin/bash
# usage: mprof.sh BIN DIR RATE : flat profile of every process of the box for 8 s, 22 s into a paced phase
BIN=$1; D=$2; RATE=$3
mkdir -p $D
$BIN/midflight-lab bench --mysql-url mysql://root@127.0.0.1:3306/test --systems midflight-mariadb --phases paced --rate $RATE --seconds 40 --ceiling-seconds 1 --run-dir $D/run --out $D/r > $D/lab.log 2>&1 &
LAB=$!
for i in $(seq 1 600); do
  N=$(pgrep -f "$BIN/consumer" | wc -l); [ "$N" -ge 2 ] && break; sleep 0.5
done
sleep 22
perf record -F 999 -a -g -o $D/all.perf -- sleep 8 2> $D/perf.err
wait $LAB
