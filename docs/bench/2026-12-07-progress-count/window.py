#!/usr/bin/env python3
"""Each run's windows (count.sh): rows the server read, index entries it stepped through, and its
CPU, a second and a message, beside the phase's row (the report's phases.csv). A window's
messages are the phase's msg/s times the window's length, so its per-message figures take the
window's rate to be the phase's. `--counters A,B,...` names other counters of SHOW GLOBAL STATUS
to print instead of the four below."""
import csv, pathlib, re, sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / '2026-12-07-pools-amd'))
from status import status  # noqa: E402

COUNTERS = ['Rows_read', 'Handler_read_next', 'Handler_read_key', 'Com_select']


def run(d, counters=COUNTERS):
    d = pathlib.Path(d)
    row = list(csv.DictReader(open(d / 'r' / 'phases.csv')))[0]
    rate = float(row['msgs_per_s'])
    print(f"{d.name}: {rate:.0f} msg/s, box {row['cpu_box_ms']} ms/msg, MariaDB {row['cpu_database_ms']} ms/msg, "
          f"busy {row['box_busy_pct']}%, added p99 {row['added_p99_ms']} ms")
    for w in sorted(d.glob('window-*-cpu.txt')):
        n = w.name.split('-')[1]
        m = re.match(r'offset (\S+) s, mariadbd ticks (\d+) (\d+), wall (\S+) (\S+)', w.read_text())
        off, a, b, t0, t1 = m.group(1), int(m.group(2)), int(m.group(3)), float(m.group(4)), float(m.group(5))
        secs = t1 - t0
        s0, s1 = status(d / f'window-{n}-status0.txt'), status(d / f'window-{n}-status1.txt')
        cells = [f"{k} {(s1[k] - s0[k]) / secs:,.0f}/s {(s1[k] - s0[k]) / secs / rate:.1f}/msg" for k in counters]
        cores = (b - a) / 100 / secs
        print(f"  from {off} s: MariaDB {cores:.2f} cores ({cores * 1000 / rate:.3f} ms/msg); " + '; '.join(cells))


if __name__ == '__main__':
    args, counters = sys.argv[1:], COUNTERS
    if args[:1] == ['--counters']:
        counters, args = args[1].split(','), args[2:]
    for d in args:
        run(d, counters)
