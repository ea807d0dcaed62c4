#!/bin/bash
# usage: count.sh BIN DIR PHASE RATE SECONDS OFFSET...   (RATE ignored at the peak)
# Runs one bench phase of midflight on MariaDB from the binaries in BIN, and at each OFFSET
# (seconds after both consumers are up) reads SHOW GLOBAL STATUS and mariadbd's CPU time from
# /proc, then again 10 s later: window-N-status0.txt, window-N-status1.txt, window-N-cpu.txt.
BIN=$1; D=$2; PHASE=$3; RATE=$4; SECONDS_=$5; shift 5
mkdir -p $D
EXTRA=""; [ "$PHASE" != peak ] && EXTRA="--rate $RATE"
CMD="$BIN/midflight-lab bench --mysql-url mysql://root@127.0.0.1:3306/test --systems midflight-mariadb --phases $PHASE $EXTRA --seconds $SECONDS_ --ceiling-seconds 1 --run-dir $D/run --out $D/r"
echo "$CMD" > $D/cmd.txt
$CMD > $D/lab.log 2>&1 &
LAB=$!
for i in $(seq 1 600); do
  C=$(pgrep -f "$BIN/consumer" | wc -l)
  [ "$C" -ge 2 ] && break
  sleep 0.5
done
UP=$(date +%s.%N)
M=$(pgrep mariadbd)
cpu() { awk '{print $14 + $15}' /proc/$M/stat; }
N=0
for OFF in "$@"; do
  N=$((N + 1))
  while [ $(echo "$(date +%s.%N) - $UP < $OFF" | bc) = 1 ]; do sleep 0.2; done
  mariadb -uroot -N -e 'show global status' > $D/window-$N-status0.txt
  A=$(cpu); T0=$(date +%s.%N)
  sleep 10
  B=$(cpu); T1=$(date +%s.%N)
  mariadb -uroot -N -e 'show global status' > $D/window-$N-status1.txt
  echo "offset $OFF s, mariadbd ticks $A $B, wall $T0 $T1" > $D/window-$N-cpu.txt
done
wait $LAB
echo "lab rc=$?" > $D/done.txt
