#!/usr/bin/env python3
"""mariadbd's flat cpu-clock profile (pools.sh's mariadb.perf, stored by keep.sh as perf report's
text in mariadb-perf.txt) by kind: kernel, libc, the server's exported symbols (the SQL layer and
what else it exports), and its unexported code (InnoDB's, mostly), the last split into samples in
a spin-wait (a PAUSE instruction at the sampled address or just before it) and the rest. Debian's
mariadbd is stripped of InnoDB's symbols; its text segment is mapped at file offset = address, so
the bytes are read from the binary."""
import re, sys

BIN = '/usr/sbin/mariadbd'
code = open(BIN, 'rb').read()

def spin(addr):
    # PAUSE is F3 90; a sample lands on it or on the next instruction.
    return code[addr:addr + 2] == b'\xf3\x90' or code[addr - 2:addr] == b'\xf3\x90'

for run in sys.argv[1:]:
    out = open(f'{run}/mariadb-perf.txt').read()
    kinds = {'kernel': 0.0, 'libc': 0.0, 'exported': 0.0, 'unexported, spin-wait': 0.0, 'unexported, other': 0.0, 'other': 0.0}
    for line in out.splitlines():
        m = re.match(r'\s*([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(\S+)', line)
        if not m:
            continue
        pct, dso, kind, sym = float(m.group(1)), m.group(2), m.group(3), m.group(4)
        if kind == 'k':
            kinds['kernel'] += pct
        elif dso.startswith('libc'):
            kinds['libc'] += pct
        elif dso == 'mariadbd' and sym.startswith('0x'):
            kinds['unexported, spin-wait' if spin(int(sym, 16)) else 'unexported, other'] += pct
        elif dso == 'mariadbd':
            kinds['exported'] += pct
        else:
            kinds['other'] += pct
    print(f"{run}: " + ', '.join(f"{k} {v:.1f}%" for k, v in kinds.items()))
