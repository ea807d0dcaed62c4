import os,sys,time,glob
names=['consumer','mock-wms','mock-logistics','mariadbd','midflight-lab','recovery-worker']
def pids(n):
    out=[]
    for p in os.listdir('/proc'):
        if p.isdigit():
            try:
                if open(f'/proc/{p}/comm').read().strip()==n: out.append(p)
            except OSError: pass
    return out
def snap():
    r={}
    for n in names:
        t=0; th=0
        for p in pids(n):
            for f in glob.glob(f'/proc/{p}/task/*/status'):
                try:
                    for l in open(f):
                        if l.startswith(('voluntary_ctxt','nonvoluntary_ctxt')): t+=int(l.split()[1])
                    th+=1
                except OSError: pass
        r[n]=(t,th)
    box=[int(l.split()[1]) for l in open('/proc/stat') if l.startswith('ctxt')][0]
    return time.time(),box,r
while len(pids('consumer'))<2: time.sleep(0.5)
time.sleep(float(sys.argv[1]))
a=snap(); time.sleep(float(sys.argv[2])); b=snap()
dt=b[0]-a[0]
print(f"window_s {dt:.2f} box_per_s {(b[1]-a[1])/dt:.0f}")
for n in names:
    print(f"{n} per_s {(b[2][n][0]-a[2][n][0])/dt:.0f} threads {a[2][n][1]}->{b[2][n][1]}")
