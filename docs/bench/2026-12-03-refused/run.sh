#!/bin/bash
# 8 consumers at the default pool of 32 (the lab's recovery worker at 16) against MariaDB's 151
# connections, peak only, before and after the store waited out refused connections.
# before, before2: release build of 3aa3dfc (built in a worktree, with a hard-linked copy of the
# main target directory as its own); wait: release build of 58f6c66; wait2: meant to be a6187a8,
# but its binaries held 58f6c66's store (a stale build: BENCHMARKS.md says how); wait3: 450ab4d
# (after cleaning and rebuilding the workspace's release artifacts); wait4, wait5: c720074;
# wait6: d69b3e5; wait7, wait8: 650036c, on an AMD EPYC box (CPU family 25), by hand, one
# after the other, each with --out run/rec/pool32-waitN and the sampler started 5 s after it.
# The first pair (wait, then before) was run by hand with the same command; the second
# (wait2, then before2) by this script; wait3 to wait6 by hand, one after another, the
# same command with --out run/rec/pool32-waitN. The server's connections are sampled every
# second by ../2026-12-03-pools/sample.sh; log-counts.txt as its header says.
cd /work/main
export MIDFLIGHT_LAB_MYSQL_URL=mysql://root@127.0.0.1:3306/test
for spec in "wait2:target/release/midflight-lab" "before2:/tmp/oldtarget/release/midflight-lab"; do
  name=${spec%%:*}; lab=${spec#*:}
  $lab bench --systems midflight-mariadb --consumers 8 --phases peak --seconds 30 --ceiling-seconds 1 --consumer-set database.max_connections=32 --out run/rec/pool32-$name > run/rec/pool32-$name.log 2>&1 &
  sleep 5
  bash docs/bench/2026-12-03-pools/sample.sh > run/rec/pool32-$name-conn.txt 2>&1
  wait
done
