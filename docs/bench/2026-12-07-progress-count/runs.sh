#!/bin/bash
# The runs of this directory, in order (nothing else running).
H=$(dirname $0); R=/tmp/pc
./count.sh /tmp/binN $R/peak-new1 peak 0 40 22
./count.sh /tmp/binO $R/peak-old1 peak 0 40 22
./count.sh /tmp/binO $R/peak-old2 peak 0 40 22
./count.sh /tmp/binN $R/peak-new2 peak 0 40 22
./count.sh /tmp/binO $R/long-old1 paced 600 180 20 160
./count.sh /tmp/binN $R/long-new1 paced 600 180 20 160
