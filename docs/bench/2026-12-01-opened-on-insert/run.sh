#!/bin/bash
# usage: run.sh BINDIR TAG PHASE [extra bench args]: one run of PHASE (peak or paced) with the
# release binaries in BINDIR, mariadbd's CPU sampled each second and its counters read
# before and after, into run/ab/TAG.
BIN=$1; TAG=$2; PHASE=$3; shift 3
cd "$(git rev-parse --show-toplevel)"
export MIDFLIGHT_LAB_MYSQL_URL=mysql://root@127.0.0.1:3306/test
OUT=run/ab/$TAG; rm -rf $OUT; mkdir -p $OUT
MPID=$(pgrep -x mariadbd)
( while true; do echo "$(date +%s.%N) $(awk '{print $14+$15}' /proc/$MPID/stat)"; sleep 1; done ) > $OUT/mariadb-cpu.txt &
SAMPLER=$!
mysql -uroot -N -e "SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_commit','Com_update','Com_insert','Com_select','Handler_update','Handler_write','Questions')" > $OUT/status-before.txt
start=$(date +%s.%N)
$BIN/midflight-lab bench --systems midflight-mariadb --phases $PHASE --seconds 40 --ceiling-seconds 1 --out $OUT/report --report-json $OUT/report.json "$@" 2> $OUT/lab.err | while IFS= read -r l; do echo "$(date +%s.%N) $l"; done > $OUT/lab.out
echo "exit ${PIPESTATUS[0]} elapsed $(echo "$(date +%s.%N) - $start" | bc)" > $OUT/exit.txt
mysql -uroot -N -e "SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_commit','Com_update','Com_insert','Com_select','Handler_update','Handler_write','Questions')" > $OUT/status-after.txt
kill $SAMPLER
