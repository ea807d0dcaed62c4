#!/bin/bash
# Two diagnostic peak runs with every statement in MariaDB's slow log (../2026-12-07-pools-amd/slowlog.sh),
# old then new; their slowsum.txt are kept. The log costs the server, so these runs' msg/s are not compared.
H=$(cd $(dirname $0) && pwd); S=$H/../2026-12-07-pools-amd/slowlog.sh
R=/tmp/oh; mkdir -p $R; cd $R
$S /tmp/binO $R/diag-old
$S /tmp/binN $R/diag-new
