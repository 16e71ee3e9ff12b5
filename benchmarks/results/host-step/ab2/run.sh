#!/bin/bash
# Host work per step, an older checkout against a newer one, alternated ROUNDS times (host_overhead.py), the
# GPU-regime step ('flat') included. Usage: benchmarks/results/host-step/ab2/run.sh BASE_CHECKOUT NEW_CHECKOUT OUT_DIR [ROUNDS]
BASE=$1 NEW=$2 OUT=$3 ROUNDS=${4:-3}
mkdir -p "$OUT"
cd /tmp || exit 1  # outside both checkouts: PYTHONPATH alone picks the plugin's code; the newer script measures both
for i in $(seq 1 "$ROUNDS"); do
  for v in base new; do
    if [ $v = base ]; then P=$BASE; else P=$NEW; fi
    PYTHONPATH=$P python "$NEW/benchmarks/host_overhead.py" --clock cpu --repeats 3 --methods never,always,flat \
        --json "$OUT/$v-$i.json" > "$OUT/$v-$i.txt" 2>&1
  done
done
