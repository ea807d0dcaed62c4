#!/usr/bin/env python3
"""Least squares of the box's CPU a message on the context switches a message of the system's
processes (consumers, mocks, MariaDB, lab; perf stat over 10 s), over the runs named."""
import pathlib, sys

from census import ROLES, counts, phase

pts = []
for d in sys.argv[1:]:
    row, msgs = phase(d)
    sw = sum(counts(d, role)['context-switches'] for role in ROLES)
    pts.append((pathlib.Path(d).name, sw / msgs, float(row['cpu_box_ms'])))
n = len(pts)
mx = sum(x for _, x, _ in pts) / n
my = sum(y for _, _, y in pts) / n
b = sum((x - mx) * (y - my) for _, x, y in pts) / sum((x - mx) ** 2 for _, x, _ in pts)
a = my - b * mx
for name, x, y in pts:
    print(f"{name:15} switches/msg {x:6.1f}  box ms/msg {y:6.3f}  fit {a + b * x:6.3f}")
print(f"box ms/msg = {a:.3f} + {b * 1000:.1f} us x switches/msg  ({n} runs)")
