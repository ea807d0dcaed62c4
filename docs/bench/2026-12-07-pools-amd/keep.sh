#!/bin/bash
# usage: keep.sh RUN...   What is stored of a run: its profile as perf report's text (the binary
# perf.data needs this box's mariadbd and kernel to be read), and not the run directory (the
# services' logs and SQLite files, about 80 MB a run).
for d in "$@"; do
  [ -f $d/mariadb.perf ] && perf report -i $d/mariadb.perf --no-children --sort dso,sym --stdio -q > $d/mariadb-perf.txt 2>/dev/null && rm $d/mariadb.perf
  rm -rf $d/run
done
