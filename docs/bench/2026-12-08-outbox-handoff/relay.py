#!/usr/bin/env python3
"""relay.txt: the relays' statements in each diagnostic run's slowsum.txt (every statement of a
peak run, ../2026-12-07-pools-amd/slowlog.sh), by kind, a message: the phase's messages plus the
200 of the warm-up. slowsum.txt lists the 25 shapes that examined the most rows; a kind missing
from a run's list is printed as such, not as zero."""
import csv, pathlib, re

HERE = pathlib.Path(__file__).resolve().parent
KINDS = [
    ('scan', re.compile(r'^SELECT `outbox`\.`biz_id` FROM `outbox` WHERE `outbox`\.`published_at_ms` IS NULL AND `outbox`\.`relay_until_ms` <=')),
    ('claim', re.compile(r'^UPDATE outbox .*SET relay_owner = \?, relay_until_ms')),
    ('read', re.compile(r'^SELECT biz_id, payload, trace_context FROM outbox')),
    ('extend', re.compile(r'^UPDATE outbox .*SET relay_until_ms = .* WHERE relay_owner = \?')),
    ('mark', re.compile(r'^UPDATE outbox .*SET published_at_ms')),
]
LINE = re.compile(r'^\s*(\d+)\s+(\d+)\s+\S+\s+(\d+)\s+([\d.]+)\s+\S+\s+(.*)$')

for run in ['diag-old', 'diag-new', 'diag-short']:
    d = HERE / run
    if not d.exists():
        continue
    row = list(csv.DictReader(open(d / 'r' / 'phases.csv')))[0]
    messages = int(row['messages']) + 200
    lines = (d / 'slowsum.txt').read_text().splitlines()
    total_secs = float(re.search(r'seconds ([\d.]+)', lines[0]).group(1))
    found = {}
    for line in lines[2:]:
        m = LINE.match(line)
        for kind, pattern in KINDS:
            if m and pattern.search(m.group(5)):
                count, examined, secs = int(m.group(1)), int(m.group(2)), float(m.group(4))
                c = found.setdefault(kind, [0, 0, 0.0])
                c[0] += count; c[1] += examined; c[2] += secs
                break
    print(f"{run}: {float(row['msgs_per_s']):,.0f} msg/s, {messages} messages")
    for kind, _ in KINDS:
        if kind in found:
            n, examined, secs = found[kind]
            print(f"  {kind:6} {n:5} statements ({n / messages:.4f}/msg), rows examined {examined / messages:.2f}/msg, "
                  f"{secs:.1f} s ({100 * secs / total_secs:.1f}% of all statements' time)")
        else:
            print(f"  {kind:6} not among the listed shapes")
    n = sum(v[0] for v in found.values()); ex = sum(v[1] for v in found.values()); secs = sum(v[2] for v in found.values())
    print(f"  all    {n:5} statements ({n / messages:.4f}/msg), rows examined {ex / messages:.2f}/msg, "
          f"{secs:.1f} s ({100 * secs / total_secs:.1f}%)")
