#!/bin/bash
# Alternating paced runs at 300 msg/s of two builds; 5 s of MariaDB's general log in each.
set -u
cd /work/main
export MIDFLIGHT_LAB_MYSQL_URL=mysql://root@127.0.0.1:3306/test
for n in 1 2; do
  for tag in before after; do
    out=run/rec/ab/$tag-$n
    /tmp/$tag-bin/midflight-lab bench --systems midflight-mariadb --phases paced --rate 300 --seconds 40 --ceiling-seconds 1 --out $out > $out.log 2>&1 &
    pid=$!
    sleep 28
    mysql -uroot -h127.0.0.1 -e "SET GLOBAL general_log_file='/tmp/gl-$tag-$n.log'; SET GLOBAL general_log=ON"
    sleep 5
    mysql -uroot -h127.0.0.1 -e "SET GLOBAL general_log=OFF"
    wait $pid
    sleep 20
  done
done
echo finished > run/rec/ab/done
