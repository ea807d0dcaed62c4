#!/bin/bash
# The deployed shape (8 consumers, 2 recovery workers at 6), peak only: consumer pools of 12 and 4, alternating.
cd /work/main
export MIDFLIGHT_LAB_MYSQL_URL=mysql://root@127.0.0.1:3306/test
for round in 1 2; do
  for pool in 12 4; do
    target/release/midflight-lab bench --systems midflight-mariadb --consumers 8 --recovery-workers 2 --recovery-set database.max_connections=6 \
      --consumer-set database.max_connections=$pool --phases peak --seconds 30 --ceiling-seconds 1 --out run/rec/pool/p$pool-r$round > run/rec/pool-p$pool-r$round.log 2>&1
    echo "pool=$pool round=$round rc=$?"
  done
done
