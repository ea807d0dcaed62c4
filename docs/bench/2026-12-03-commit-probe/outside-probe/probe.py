# Stall probe: one single-row autocommit insert every 20 ms on its own database, with its latency,
# and every 250 ms InnoDB's flushing state and the disk's write counters.
import sys, time, threading, pymysql
out = sys.argv[1]; secs = float(sys.argv[2])
c = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
cur = c.cursor()
cur.execute("CREATE DATABASE IF NOT EXISTS stallprobe")
cur.execute("CREATE TABLE IF NOT EXISTS stallprobe.t (id BIGINT AUTO_INCREMENT PRIMARY KEY, at DOUBLE)")
s = pymysql.connect(host="127.0.0.1", user="root", autocommit=True).cursor()
keys = ["Innodb_buffer_pool_pages_dirty", "Innodb_checkpoint_age", "Innodb_data_fsyncs", "Innodb_os_log_written", "Innodb_data_written", "Innodb_history_list_length"]
def disk():
    for l in open("/proc/diskstats"):
        f = l.split()
        if f[2] == "vda": return int(f[7]), int(f[9]), int(f[10])
end = time.time() + secs
st = open(out + ".status.csv", "w"); st.write("t,dirty,ckpt_age,data_fsyncs,log_written,data_written,history,disk_writes,disk_sectors,disk_write_ms\n")
pr = open(out + ".probe.csv", "w"); pr.write("t,latency_ms\n")
def status():
    while time.time() < end:
        s.execute("SHOW GLOBAL STATUS WHERE Variable_name IN (%s)" % ",".join("'%s'" % k for k in keys))
        d = dict(s.fetchall())
        w, sec, ms = disk()
        st.write("%.3f,%s,%d,%d,%d\n" % (time.time(), ",".join(str(d.get(k, "")) for k in keys), w, sec, ms)); st.flush()
        time.sleep(0.25)
threading.Thread(target=status, daemon=True).start()
while time.time() < end:
    t0 = time.time()
    cur.execute("INSERT INTO stallprobe.t (at) VALUES (%s)", (t0,))
    pr.write("%.3f,%.2f\n" % (t0, (time.time() - t0) * 1000))
    time.sleep(max(0, 0.02 - (time.time() - t0)))
pr.close()
