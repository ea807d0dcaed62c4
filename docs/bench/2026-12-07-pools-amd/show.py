#!/usr/bin/env python3
"""One line a run from its phases.csv: rate, tails, write transactions, CPU a message by role."""
import sys, pathlib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / '2026-12-07-syscalls'))
from census import phase  # noqa: E402

K = ['msgs_per_s', 'added_p50_ms', 'added_p99_ms', 'write_txns_per_msg', 'cpu_box_ms', 'cpu_database_ms',
     'cpu_consumers_ms', 'cpu_mocks_ms', 'box_busy_pct', 'rss_mib', 'rebalances', 'handover_max_ms',
     'duplicates', 'violations', 'lost']
print('run,' + ','.join(K))
for d in sys.argv[1:]:
    r, _ = phase(pathlib.Path(d) / 'r')
    print(pathlib.Path(d).name + ',' + ','.join(r[k] for k in K))
