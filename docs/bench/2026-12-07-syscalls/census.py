#!/usr/bin/env python3
"""Per message, from a run's perf stat files (10 s windows): syscalls, context switches and CPU ms by role.
Messages in the window = the phase's msg/s x 10 s (paced phases keep up with their rate)."""
import csv, sys, pathlib

ROLES = ['consumers', 'mocks', 'mariadb', 'lab']


def phase(run):
    """The run's phase row and the messages in its 10 s window."""
    row = list(csv.DictReader(open(pathlib.Path(run) / 'phases.csv')))[0]
    return row, float(row['msgs_per_s']) * 10


def counts(run, role):
    """perf stat's counts for a role, by event name; None when the role was not counted."""
    f = pathlib.Path(run) / f'stat-{role}.txt'
    if not f.exists():
        return None
    v = {}
    for line in f.read_text().splitlines():
        parts = line.split(',')
        if len(parts) > 2 and not line.startswith('#'):
            v[parts[2]] = float(parts[0])
    return v


if __name__ == '__main__':
    for d in sys.argv[1:]:
        row, msgs = phase(d)
        out = [f"{pathlib.Path(d).name}: {float(row['msgs_per_s']):.0f} msg/s, box {row['cpu_box_ms']} ms/msg, busy {row['box_busy_pct']}%, added p99 {row['added_p99_ms']} ms"]
        for role in ROLES + ['all']:
            v = counts(d, role)
            if v is None:
                continue
            out.append(f"  {role:9} syscalls {v['raw_syscalls:sys_enter']/msgs:6.1f}  switches {v['context-switches']/msgs:5.1f}  cpu ms {v['task-clock']/msgs:5.3f}")
        print('\n'.join(out))
