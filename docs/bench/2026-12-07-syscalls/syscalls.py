#!/usr/bin/env python3
"""Syscalls a message by thread name and syscall, from a sysid.sh run's sysids.txt (5 s of
raw_syscalls:sys_enter on the consumers, the mocks and mariadbd; messages = msg/s x 5 s)."""
import collections, csv, sys
NAMES = {'202': 'futex', '17': 'pread64', '18': 'pwrite64', '45': 'recvfrom', '44': 'sendto', '232': 'epoll_wait',
         '7': 'poll', '20': 'writev', '72': 'fcntl', '47': 'recvmsg', '1': 'write', '426': 'io_uring_enter'}
for d in sys.argv[1:]:
    row = list(csv.DictReader(open(d + '/phases.csv')))[0]
    msgs = float(row['msgs_per_s']) * 5
    counts = collections.Counter()
    for line in open(d + '/sysids.txt'):
        fields = line.split()
        counts[(' '.join(fields[1:-1]), fields[-1])] += int(fields[0])
    print(f"{d}: {row['msgs_per_s']} msg/s; {sum(counts.values()) / msgs:.1f} syscalls a message")
    for (comm, nr), n in counts.most_common(8):
        print(f"    {comm:16} {NAMES.get(nr, nr):14} {n / msgs:6.1f}")
