#!/usr/bin/env python3
"""MariaDB's SHOW GLOBAL STATUS counters a message over each run's 10 s window (status0.txt to
status1.txt), side by side. The phase's row and the messages in the window come from census.py of
2026-12-07-syscalls (msg/s x 10 s). Prints the counters that moved in every run; with --all, every
counter that moved."""
import sys, pathlib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / '2026-12-07-syscalls'))
from census import phase  # noqa: E402

# Counters that are levels, not counts: their difference is not a rate.
LEVELS = {'Threads_running', 'Threads_connected', 'Threads_cached', 'Open_tables', 'Open_files',
          'Innodb_buffer_pool_pages_data', 'Innodb_buffer_pool_pages_dirty', 'Innodb_buffer_pool_pages_free',
          'Innodb_buffer_pool_pages_misc', 'Innodb_buffer_pool_bytes_data', 'Innodb_buffer_pool_bytes_dirty',
          'Uptime', 'Uptime_since_flush_status', 'Memory_used', 'Memory_used_initial', 'Max_used_connections'}


def status(f):
    v = {}
    for line in pathlib.Path(f).read_text().splitlines():
        k, _, x = line.partition('\t')
        try:
            v[k] = float(x)
        except ValueError:
            pass
    return v


def per_msg(run):
    row, msgs = phase(pathlib.Path(run) / 'r')
    a, b = status(pathlib.Path(run) / 'status0.txt'), status(pathlib.Path(run) / 'status1.txt')
    return row, {k: (b[k] - a[k]) / msgs for k in b if k in a and k not in LEVELS and not k.startswith('Innodb_lsn')}


if __name__ == '__main__':
    args = [a for a in sys.argv[1:] if a != '--all']
    runs = [(pathlib.Path(d).name, *per_msg(d)) for d in args]
    keys = sorted({k for _, _, v in runs for k in v})
    every_run = any if '--all' in sys.argv else all
    moved = [k for k in keys if every_run(v.get(k, 0) != 0 for _, _, v in runs)]
    print(f"{'counter a message':42}" + ''.join(f"{n:>14}" for n, _, _ in runs))
    print(f"{'(msg/s)':42}" + ''.join(f"{float(r['msgs_per_s']):>14.0f}" for _, r, _ in runs))
    for k in moved:
        print(f"{k:42}" + ''.join(f"{v.get(k, 0):>14.3f}" for _, _, v in runs))
