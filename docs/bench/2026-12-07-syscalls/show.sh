#!/bin/bash
for d in "$@"; do echo "== $d $(grep -A4 '## CPU per message' $d/r/report.md | tail -1)"; python3 - $d <<'PY'
import csv,sys
r=list(csv.DictReader(open(sys.argv[1]+'/r/phases.csv')))[0]
print({k:r[k] for k in ['msgs_per_s','added_p50_ms','added_p99_ms','after_arrival_p99_ms','arrival_p99_ms','write_txns_per_msg','db_commit_p99_ms','duplicates','lost','violations']})
PY
for f in $d/stat-*.txt; do echo "  $(basename $f) $(grep -v '^#' $f | grep . | cut -d, -f1,3 | tr '\n' ' ')"; done; done
