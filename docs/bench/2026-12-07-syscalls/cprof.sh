#!/bin/bash
# usage: cprof.sh BIN DIR RATE : dwarf profile of one consumer for 8 s, 22 s into a paced phase
BIN=$1; D=$2; RATE=$3
mkdir -p $D
$BIN/midflight-lab bench --mysql-url mysql://root@127.0.0.1:3306/test --systems midflight-mariadb --phases paced --rate $RATE --seconds 40 --ceiling-seconds 1 --run-dir $D/run --out $D/r > $D/lab.log 2>&1 &
LAB=$!
for i in $(seq 1 600); do
  C=$(pgrep -f "$BIN/consumer" | head -1); N=$(pgrep -f "$BIN/consumer" | wc -l)
  [ "$N" -ge 2 ] && break
  sleep 0.5
done
sleep 22
perf record -F 1999 --call-graph dwarf,16384 -p $C -o $D/c.perf -- sleep 8 2> $D/perf.err
wait $LAB
