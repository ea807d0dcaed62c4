#!/usr/bin/env python3
"""windows.txt: each run's phase row (the report's phases.csv) and, over its 10 s window
(count.sh), the server's statements, commits, row updates and key lookups a message, and its
CPU; the phase's own counts of commits, write statements and log writes a message. A window's messages are the phase's msg/s times the window's length, as in window.py."""
import csv, pathlib, re, sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / '2026-12-07-pools-amd'))
from status import status  # noqa: E402

# runs.sh's series, then runs2.sh's, then half.sh's, each in the order it ran.
RUNS = ['peak-new1', 'peak-old1', 'peak-old2', 'peak-new2', 'paced-old1', 'paced-new1', 'paced-new2', 'paced-old2',
        'peak-old3', 'peak-short1', 'peak-short2', 'peak-old4', 'paced-short1', 'paced-old3', 'paced-old4',
        'paced-short2', 'half-final1', 'half-old1', 'half-old2', 'half-final2',
        'half-old3', 'half-final3', 'half-final4', 'half-old4']
COUNTERS = ['Questions', 'Com_stmt_execute', 'Handler_commit', 'Innodb_data_fsyncs', 'Handler_update',
            'Handler_read_key', 'Rows_read']


def run(d):
    row = list(csv.DictReader(open(d / 'r' / 'phases.csv')))[0]
    rate = float(row['msgs_per_s'])
    w = (d / 'window-1-cpu.txt').read_text()
    m = re.match(r'offset (\S+) s, mariadbd ticks (\d+) (\d+), wall (\S+) (\S+)', w)
    a, b, secs = int(m.group(2)), int(m.group(3)), float(m.group(5)) - float(m.group(4))
    s0, s1 = status(d / 'window-1-status0.txt'), status(d / 'window-1-status1.txt')
    per = {k: (s1[k] - s0[k]) / secs / rate for k in COUNTERS}
    cores = (b - a) / 100 / secs
    return row, rate, cores, per


def main():
    print('| run | msg/s | box ms/msg | MariaDB ms/msg (phase) | MariaDB cores (window) | '
          + ' | '.join(COUNTERS) + ' | phase: commits, write statements, log writes a message | added p99 ms | write txns/msg | duplicates, violations, lost |')
    print('|' + '---|' * (len(COUNTERS) + 9))
    for name in RUNS:
        row, rate, cores, per = run(HERE / name)
        cells = ' | '.join(f'{per[k]:.3f}' for k in COUNTERS)
        print(f"| {name} | {rate:,.0f} | {float(row['cpu_box_ms']):.3f} | {float(row['cpu_database_ms']):.3f} | "
              f"{cores:.2f} | {cells} | {float(row['mysql_commits_per_msg']):.3f}, "
              f"{float(row['mysql_write_statements_per_msg']):.3f}, {float(row['mysql_log_writes_per_msg']):.3f} | "
              f"{float(row['added_p99_ms']):,.0f} | {row['write_txns_per_msg']} | "
              f"{row['duplicates']}, {row['violations']}, {row['lost']} |")


if __name__ == '__main__':
    main()
