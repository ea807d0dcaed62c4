import csv,sys
for n in sys.argv[1:]:
    r=list(csv.DictReader(open(f'/tmp/cs/{n}/r/phases.csv')))[0]
    ks=('msgs_per_s','p50_ms','p99_ms','added_p50_ms','added_p99_ms','arrival_p99_ms','after_arrival_p50_ms','after_arrival_p99_ms','call_mean_ms','write_txns_per_msg','cpu_consumers_ms','cpu_mocks_ms','cpu_lab_ms','cpu_database_ms','cpu_box_ms','box_busy_pct','duplicates','violations','lost')
    print(n, ' '.join(f"{k.replace('_ms','')}={r[k]}" for k in ks))
