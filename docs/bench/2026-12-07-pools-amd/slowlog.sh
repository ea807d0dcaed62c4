#!/bin/bash
# usage: slowlog.sh BIN DIR   A peak run with MariaDB's slow log taking every statement.
# long_query_time, log_slow_verbosity and the log's own switch are copied into a session when it
# connects, so all three are set before the services connect, and the log stays on for the run.
# A diagnostic run: the log costs the server, so its msg/s is not compared with the others.
# The log (hundreds of MB) is summed by slowsum.py and then deleted.
BIN=$1; D=$2
mkdir -p $D
LOG=/var/lib/mysql/midflight-diag-slow.log
rm -f $LOG
mariadb -uroot -e "SET GLOBAL slow_query_log_file='$LOG'; SET GLOBAL long_query_time=0; SET GLOBAL log_slow_verbosity='query_plan'; SET GLOBAL slow_query_log=1"
$BIN/midflight-lab bench --mysql-url mysql://root@127.0.0.1:3306/test --systems midflight-mariadb --phases peak --seconds 40 --ceiling-seconds 1 --run-dir $D/run --out $D/r > $D/lab.log 2>&1
echo "lab rc=$?" > $D/done.txt
mariadb -uroot -e "SET GLOBAL slow_query_log=0; SET GLOBAL long_query_time=10; SET GLOBAL log_slow_verbosity=''; SET GLOBAL slow_query_log_file='vm-slow.log'"
python3 $(dirname $0)/slowsum.py $LOG > $D/slowsum.txt
rm -f $LOG
