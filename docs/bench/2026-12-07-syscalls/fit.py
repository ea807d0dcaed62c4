#!/usr/bin/env python3
"""Least squares of the box's CPU a message on the context switches a message of the system's
processes (consumers, mocks, MariaDB, lab; perf stat over 10 s), over the runs named."""
import csv, sys, pathlib
pts = []
for d in sys.argv[1:]:
    p = pathlib.Path(d)
    row = list(csv.DictReader(open(p / 'phases.csv')))[0]
    msgs = float(row['msgs_per_s']) * 10
    sw = 0.0
    for role in ['consumers', 'mocks', 'mariadb', 'lab']:
        for line in (p / f'stat-{role}.txt').read_text().splitlines():
            parts = line.split(',')
            if len(parts) > 2 and parts[2] == 'context-switches':
                sw += float(parts[0])
    pts.append((p.name, sw / msgs, float(row['cpu_box_ms'])))
n = len(pts)
mx = sum(x for _, x, _ in pts) / n
my = sum(y for _, _, y in pts) / n
b = sum((x - mx) * (y - my) for _, x, y in pts) / sum((x - mx) ** 2 for _, x, _ in pts)
a = my - b * mx
for name, x, y in pts:
    print(f"{name:15} switches/msg {x:6.1f}  box ms/msg {y:6.3f}  fit {a + b * x:6.3f}")
print(f"box ms/msg = {a:.3f} + {b * 1000:.1f} us x switches/msg  ({n} runs)")
