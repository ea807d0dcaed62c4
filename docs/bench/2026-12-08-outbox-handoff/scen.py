#!/usr/bin/env python3
"""scenarios.txt: each kill scenario's runs (scenarios.sh, runs2.sh), their time until every saga
was terminal and every notification published, and what the checker found."""
import json, pathlib

HERE = pathlib.Path(__file__).resolve().parent
for name in ['recovery-races-consumer', 'kill-after-lock-sent', 'rebalance-storm']:
    for run in ['new1', 'old1', 'old2', 'new2', 'short1', 'short2']:
        f = HERE / f'scenario-{name}-{run}.json'
        if not f.exists():
            continue
        for s in json.load(open(f)):
            print(f"{name} {run}: {s['seconds_to_quiescence']:.1f} s, quiescent {s['quiescent']}, "
                  f"duplicates {s['duplicate_effects']}, lost {s['lost']}, violations {len(s['violations'])}, "
                  f"takeovers {s['takeovers']}")
