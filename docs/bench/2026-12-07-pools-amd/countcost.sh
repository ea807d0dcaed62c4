#!/bin/bash
# What the harness's progress count costs the server on its own, with nothing else running:
# the bench's `SELECT COUNT(*) ... FORCE INDEX (saga_recovery) WHERE status = 'DONE'` (store
# `count_status`, sampled once a second by `crates/lab/src/bench/phase.rs`) over a table of
# 70,000 rows, 68,000 of them DONE, with the saga table's key and index; 50 counts, three times.
mariadb -uroot test -e "DROP TABLE IF EXISTS cnt_probe; CREATE TABLE cnt_probe (biz_id VARCHAR(64) PRIMARY KEY, status VARCHAR(32) NOT NULL, lease_until_ms BIGINT NOT NULL, pad VARCHAR(400), KEY saga_recovery (status, lease_until_ms)) ENGINE=InnoDB; SET SESSION max_recursive_iterations=100000; INSERT INTO cnt_probe WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM s WHERE n < 70000) SELECT CONCAT('bench-peak-0-', LPAD(n,8,'0'), ':PAID'), IF(n % 35 = 0, 'WMS_LOCKED', 'DONE'), 1796650000000 + n*10, REPEAT('x', 300) FROM s; ANALYZE TABLE cnt_probe;" > /dev/null
mariadb -uroot test -N -e "SELECT COUNT(*) FROM cnt_probe FORCE INDEX (saga_recovery) WHERE status = 'DONE'"
for i in 1 2 3; do
  /usr/bin/time -f '%e s for 50 counts' bash -c 'for j in $(seq 1 50); do echo "SELECT COUNT(*) FROM cnt_probe FORCE INDEX (saga_recovery) WHERE status = \"DONE\";"; done | mariadb -uroot test > /dev/null'
done
mariadb -uroot test -e "DROP TABLE cnt_probe"
