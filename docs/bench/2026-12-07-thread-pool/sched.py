"""Run-queue waits by role over a window of a bench phase.

Waits until both consumers run, sleeps START seconds, reads every thread's
/proc/<pid>/task/<tid>/schedstat (time on a core, time waiting on a run queue, times run)
for each role, and again LENGTH seconds later. Threads present at both reads count.
Usage: sched.py START LENGTH
"""
import glob, os, sys, time

NAMES = ['consumer', 'mock-wms', 'mock-logistics', 'mariadbd', 'midflight-lab', 'recovery-worker']

def pids(name):
    out = []
    for p in os.listdir('/proc'):
        if p.isdigit():
            try:
                if open(f'/proc/{p}/comm').read().strip() == name:
                    out.append(p)
            except OSError:
                pass
    return out

def snap():
    threads = {}
    for name in NAMES:
        for p in pids(name):
            for f in glob.glob(f'/proc/{p}/task/*/schedstat'):
                try:
                    run, wait, slices = (int(x) for x in open(f).read().split())
                except (OSError, ValueError):
                    continue
                threads[f] = (name, run, wait, slices)
    return time.time(), threads

while len(pids('consumer')) < 2:
    time.sleep(0.5)
time.sleep(float(sys.argv[1]))
t0, a = snap()
time.sleep(float(sys.argv[2]))
t1, b = snap()
dt = t1 - t0
print(f'window_s {dt:.2f}')
print('role threads cores_on_cpu threads_waiting slices_per_s mean_wait_ms_per_slice')
total = [0, 0, 0]
for name in NAMES:
    run = wait = slices = n = 0
    for f, (role, r1, w1, s1) in b.items():
        if role != name or f not in a:
            continue
        _, r0, w0, s0 = a[f]
        run += r1 - r0; wait += w1 - w0; slices += s1 - s0; n += 1
    total[0] += run; total[1] += wait; total[2] += slices
    mean = wait / slices / 1e6 if slices else 0.0
    print(f'{name} {n} {run / dt / 1e9:.3f} {wait / dt / 1e9:.3f} {slices / dt:.0f} {mean:.3f}')
mean = total[1] / total[2] / 1e6 if total[2] else 0.0
print(f'all {total[0] / dt / 1e9:.3f} {total[1] / dt / 1e9:.3f} {total[2] / dt:.0f} {mean:.3f}')
