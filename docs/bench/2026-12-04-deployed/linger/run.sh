#!/bin/bash
# The deployed shape (8 consumers at 12 connections, 2 recovery workers at 6), paced at 400 msg/s:
# database.group_commit_linger_ms 0 (the default) against 3, alternating.
cd /work/main
export MIDFLIGHT_LAB_MYSQL_URL=mysql://root@127.0.0.1:3306/test
for round in 1 2; do
  for linger in 0 3; do
    target/release/midflight-lab bench --systems midflight-mariadb --consumers 8 --recovery-workers 2 --recovery-set database.max_connections=6 \
      --consumer-set database.max_connections=12 --consumer-set database.group_commit_linger_ms=$linger \
      --phases paced --rate 400 --seconds 30 --ceiling-seconds 1 --out run/rec/linger/l$linger-r$round > run/rec/linger-l$linger-r$round.log 2>&1
    echo "linger=$linger round=$round rc=$?"
  done
done
