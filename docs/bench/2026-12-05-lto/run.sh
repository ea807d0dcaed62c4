#!/bin/bash
# Release builds compared: "plain" (the workspace's release profile: no LTO, 16 codegen units)
# against "lto" (the same commit built with CARGO_PROFILE_RELEASE_LTO=fat and
# CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1). Alternating runs, each on a fresh system: peak, and
# paced at a fixed 700 msg/s, of midflight on MariaDB and of baseline B.
# Builds of 4ece612, each from an empty target directory, binaries copied aside:
#   plain: cargo build --release --quiet --bins                      (6 min 43 s) -> /tmp/build-plain
#   lto:   CARGO_TARGET_DIR=/work/target-lto CARGO_PROFILE_RELEASE_LTO=fat \
#          CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 cargo build --release --quiet --bins  (7 min 50 s) -> /tmp/build-lto
# table.py makes table.md from the JSON reports kept here.
set -u
cd /work/main
export MIDFLIGHT_LAB_MYSQL_URL=mysql://root@127.0.0.1:3306/test
for n in 1 2; do
  for tag in plain lto; do
    out=run/rec/lto/$tag-$n
    /tmp/build-$tag/midflight-lab bench --systems midflight-mariadb,baseline-b --phases peak,paced --rate 700 \
      --seconds 40 --ceiling-seconds 1 --out $out --report-json $out.json > $out.log 2>&1
    echo "$tag-$n rc=$?"
  done
done
echo finished
