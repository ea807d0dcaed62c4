#!/bin/bash
cd /work/main
for i in 1 2; do
  for n in 16 12; do
    MIDFLIGHT_LAB_MYSQL_URL=mysql://root@127.0.0.1:3306/test timeout 900 target/release/midflight-lab bench --systems midflight-mariadb --phases peak --seconds 30 --ceiling-seconds 1 --consumer-set database.max_connections=$n --out /tmp/pair/p$n-$i > /tmp/pair/p$n-$i.log 2>&1
    echo "p$n-$i rc=$?" >> /tmp/pair/done.txt
    sleep 5
  done
done
