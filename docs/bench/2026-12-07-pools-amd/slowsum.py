#!/usr/bin/env python3
"""Sums a MariaDB slow log (long_query_time=0) by statement shape: literals become ?, an IN list
becomes IN (...), so one shape counts every batch size. Prints each shape's statements, rows
examined, rows sent and seconds, largest rows examined first, with each one's share of the total."""
import re, sys
from collections import defaultdict

def shape(sql):
    s = re.sub(r"'(?:[^'\\]|\\.)*'", '?', sql)
    s = re.sub(r'\b\d+(\.\d+)?\b', '?', s)
    s = re.sub(r'IN \((\?,? ?)+\)', 'IN (...)', s)
    s = re.sub(r'\((\?, ?)+\?\)', '(...)', s)
    s = re.sub(r'(\(\.\.\.\),? ?)+', '(...) ', s)
    return re.sub(r'\s+', ' ', s).strip()[:300]

tot = defaultdict(lambda: [0, 0, 0, 0.0])
cur = None
sql = []
def flush():
    if cur and sql:
        t = tot[shape(' '.join(sql))]
        t[0] += 1; t[1] += cur[0]; t[2] += cur[1]; t[3] += cur[2]
for line in open(sys.argv[1], errors='replace'):
    if line.startswith('# Query_time:'):
        flush()
        m = re.search(r'Query_time: ([\d.]+).*Rows_sent: (\d+).*Rows_examined: (\d+)', line)
        cur = (int(m.group(3)), int(m.group(2)), float(m.group(1))); sql = []
    elif line.startswith('#') or line.startswith('SET timestamp=') or line.startswith('use '):
        continue
    elif cur is not None:
        sql.append(line.strip())
flush()
rows = sum(v[1] for v in tot.values()); secs = sum(v[3] for v in tot.values())
print(f"statements {sum(v[0] for v in tot.values())}, rows examined {rows}, seconds {secs:.2f}")
print(f"{'count':>8} {'examined':>10} {'%':>5} {'sent':>9} {'secs':>7} {'%':>5}  shape")
for k, v in sorted(tot.items(), key=lambda kv: -kv[1][1])[:25]:
    print(f"{v[0]:>8} {v[1]:>10} {100*v[1]/max(rows,1):>5.1f} {v[2]:>9} {v[3]:>7.2f} {100*v[3]/max(secs,1e-9):>5.1f}  {k}")
