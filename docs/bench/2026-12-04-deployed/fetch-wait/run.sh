#!/bin/bash
# Paced 400 msg/s, two consumers: the lab's fetch wait (10 ms) against 100 ms, alternating.
cd /work/main
export MIDFLIGHT_LAB_MYSQL_URL=mysql://root@127.0.0.1:3306/test
for round in 1 2; do
  for wait in 10 100; do
    target/release/midflight-lab bench --systems midflight-mariadb --phases paced --rate 400 --seconds 30 --ceiling-seconds 1 \
      --consumer-set kafka.properties.fetch.wait.max.ms=$wait --out run/rec/fw/w$wait-r$round > run/rec/fw-w$wait-r$round.log 2>&1
    echo "wait=$wait round=$round rc=$?"
  done
done
