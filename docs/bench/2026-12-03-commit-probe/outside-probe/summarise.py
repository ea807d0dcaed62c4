# Per run of lab.log (from 3 s after "starting" to "collecting"): the outside probe's commit
# latency, and the disk's and InnoDB's counters from the status file. Usage: python3 summarise.py
import csv, gzip
rows = [(float(t), float(l)) for t, l in list(csv.reader(gzip.open("probe.csv.gz", "rt")))[1:]]
status = list(csv.DictReader(gzip.open("status.csv.gz", "rt")))
lines = open("lab.log").read().splitlines()
starts = [float(l.split()[0]) for l in lines if "starting" in l]
ends = [float(l.split()[0]) for l in lines if "collecting" in l]
for n, (a, b) in enumerate(zip(starts, ends), 1):
    ls = sorted(l for t, l in rows if a + 3 <= t < b)
    k = len(ls)
    w = [x for x in status if a + 3 <= float(x["t"]) < b]
    f, l = w[0], w[-1]
    dt = float(l["t"]) - float(f["t"])
    d = lambda key: int(l[key]) - int(f[key])
    print(
        "run %d: probe commits %d, p50 %.1f ms, p99 %.1f ms, max %.1f ms, over 20 ms %d; "
        "disk writes/s %.0f, ms per write %.2f, MB/s %.1f; InnoDB fsyncs/s %.0f, log KB/s %.0f"
        % (n, k, ls[k // 2], ls[int(k * 0.99)], ls[-1], sum(1 for x in ls if x > 20),
           d("disk_writes") / dt, d("disk_write_ms") / d("disk_writes"), d("disk_sectors") * 512 / 1e6 / dt,
           d("data_fsyncs") / dt, d("log_written") / 1e3 / dt)
    )
