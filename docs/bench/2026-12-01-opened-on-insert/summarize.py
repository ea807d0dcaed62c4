"""usage: summarize.py DIR TAG...: per run in DIR/TAG (as run.sh leaves it, or as kept here), msg/s,
mariadbd CPU per message from 15 s to 35 s into the phase, and MariaDB counters per message."""
import os,sys,csv
for tag in sys.argv[2:]:
    d=os.path.join(sys.argv[1],tag)
    rep=d+'/report' if os.path.isdir(d+'/report') else d
    out=d+'/lab.out' if os.path.exists(d+'/lab.out') else d+'/lab.txt'
    start=None
    for l in open(out):
        ts,_,rest=l.partition(' ')
        if 'peak: starting' in rest: start=float(ts)
    cpu=[tuple(map(float,l.split())) for l in open(d+'/mariadb-cpu.txt') if len(l.split())==2]
    ser=[r for r in csv.DictReader(open(rep+'/series.csv'))]
    def done_at(t):
        best=None
        for r in ser:
            if float(r['t_s'])<=t: best=int(r['done'])
        return best
    def cpu_at(t):
        best=None
        for a,b in cpu:
            if a<=t: best=b
        return best
    t0,t1=15,35
    dm=done_at(t1)-done_at(t0)
    dc=(cpu_at(start+t1)-cpu_at(start+t0))/100.0
    ph=list(csv.DictReader(open(rep+'/phases.csv')))[0]
    b=dict(l.split() for l in open(d+'/status-before.txt')); a=dict(l.split() for l in open(d+'/status-after.txt'))
    n=int(ph['messages'])
    per={k:(int(a[k])-int(b[k]))/n for k in a}
    print(f"{tag}: {ph['msgs_per_s']} msg/s, window msgs {dm}, mariadb cpu {dc:.1f}s = {1000*dc/dm:.3f} ms/msg ({100*dc/(t1-t0):.0f}%), added p50/p99 {ph['added_p50_ms']}/{ph['added_p99_ms']}, dup {ph['duplicates']} viol {ph['violations']}; per msg: "+", ".join(f"{k} {v:.2f}" for k,v in sorted(per.items())))
