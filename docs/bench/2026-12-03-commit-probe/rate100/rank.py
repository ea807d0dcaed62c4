# Every paced phase here (phases.csv files): the database's own commit p99 against the
# system's after-arrival p99, sorted by the first, and their rank correlation (Spearman).
import csv, glob
points = []
for path in sorted(glob.glob("*phases.csv")):
    for r in csv.DictReader(open(path)):
        points.append((float(r["db_commit_p99_ms"]), int(r["after_arrival_p99_ms"]), path.split("-")[0], r["system"]))
points.sort()
for p in points:
    print("%-10s %-18s db commit p99 %6.2f ms  after arrival p99 %4d ms" % (p[2], p[3], p[0], p[1]))
def ranks(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    for rank, i in enumerate(order):
        out[i] = rank
    return out
a, b = ranks([p[0] for p in points]), ranks([p[1] for p in points])
n = len(points)
print("Spearman rank correlation over %d phases: %.2f" % (n, 1 - 6 * sum((x - y) ** 2 for x, y in zip(a, b)) / (n * (n * n - 1))))
