# The table in BENCHMARKS.md ("Link-time optimisation"), from the runs' JSON reports:
#   python3 table.py DIR   (DIR holds plain-1.json, lto-1.json, ...)
import glob
import json
import os
import sys

rows = []
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    tag = os.path.basename(f)[:-5]
    for p in json.load(open(f))["phases"]:
        c = p["cpu"]
        rows.append((p["system"], p["phase"], tag, p["msgs_per_s"], c["box_busy_pct"], c["box_ms"], c["consumers_ms"],
                     c["mocks_ms"], c["database_ms"], c["lab_ms"], p["added_p50_ms"], p["added_p99_ms"],
                     p["after_arrival_p99_ms"], p["duplicates"]))
rows.sort()
print("| system | phase | build | msg/s | box busy | box ms/msg | consumers | mocks | database | lab | added p50 / p99 ms | after arrival p99 | dup |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print("| %s | %s | %s | %.0f | %.0f%% | %.3f | %.3f | %.3f | %.3f | %.3f | %d / %d | %d | %d |" % r)
