import re,sys,collections,csv
for tag in ['before','after']:
    for n in [1,2]:
        try: text=open(f'/tmp/gl-{tag}-{n}.log').read().split('\n')
        except FileNotFoundError: continue
        stmts=[]
        for l in text:
            m=re.match(r'^(?:\d{6}\s+[\d:]+)?\s+(\d+)\s+(Query|Execute)\t(.*)$',l)
            if m: stmts.append(m.group(3).strip())
        msgs=sum(1 for s in stmts if s.startswith('UPDATE orders'))
        inbox=sum(1 for s in stmts if s.startswith('INSERT INTO saga ('))
        sel=sum(1 for s in stmts if s.startswith('SELECT') and 'FROM saga' in s and ('biz_id IN' in s or 'MIN(src_offset)' in s))
        r=next(csv.DictReader(open(f'run/rec/ab/{tag}-{n}/phases.csv')))
        print(f"{tag}-{n}: statements {len(stmts)}, messages {msgs}, per msg {len(stmts)/max(msgs,1):.2f}, inbox batches {inbox}, inbox reads {sel} ({sel/max(inbox,1):.2f}/batch); "
              f"msg/s {r['msgs_per_s']} added {r['added_p50_ms']}/{r['added_p99_ms']} after {r['after_arrival_p50_ms']}/{r['after_arrival_p99_ms']} "
              f"cpu consumers {r['cpu_consumers_ms']} db {r['cpu_database_ms']} box {r['cpu_box_ms']} busy {r['box_busy_pct']}")
