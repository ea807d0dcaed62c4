#!/usr/bin/env python3
"""Per message, from a run's perf stat files (10 s windows): syscalls, context switches and CPU ms by role.
Messages in the window = the phase's msg/s x 10 s (paced phases keep up with their rate)."""
import csv, sys, pathlib
for d in sys.argv[1:]:
    p = pathlib.Path(d)
    row = list(csv.DictReader(open(p / 'phases.csv')))[0]
    msgs = float(row['msgs_per_s']) * 10
    out = [f"{p.name}: {float(row['msgs_per_s']):.0f} msg/s, box {row['cpu_box_ms']} ms/msg, busy {row['box_busy_pct']}%, added p99 {row['added_p99_ms']} ms"]
    for role in ['consumers', 'mocks', 'mariadb', 'lab', 'all']:
        f = p / f'stat-{role}.txt'
        if not f.exists():
            continue
        v = {}
        for line in f.read_text().splitlines():
            parts = line.split(',')
            if len(parts) > 2 and not line.startswith('#'):
                v[parts[2]] = float(parts[0])
        out.append(f"  {role:9} syscalls {v['raw_syscalls:sys_enter']/msgs:6.1f}  switches {v['context-switches']/msgs:5.1f}  cpu ms {v['task-clock']/msgs:5.3f}")
    print('\n'.join(out))
