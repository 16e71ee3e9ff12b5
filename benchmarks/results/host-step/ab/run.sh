#!/bin/bash
# Host work per step, an older checkout against a newer one, alternated three times (host_overhead.py).
# Usage: benchmarks/results/host-step/ab/run.sh BASE_CHECKOUT NEW_CHECKOUT OUT_DIR
BASE=$1 NEW=$2 OUT=$3
mkdir -p "$OUT"
cd /tmp || exit 1  # outside both checkouts: PYTHONPATH alone picks the code
for i in 1 2 3; do
  for v in base new; do
    if [ $v = base ]; then P=$BASE; else P=$NEW; fi
    PYTHONPATH=$P:$NEW python -m benchmarks.host_overhead --clock cpu --repeats 3 --methods never,always \
        --json "$OUT/$v-$i.json" > "$OUT/$v-$i.txt" 2>&1
  done
done
