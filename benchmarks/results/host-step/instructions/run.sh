#!/bin/bash
# Instructions per decode step of two checkouts, counted by callgrind (count.py); about 4 minutes per method and
# checkout. Usage: benchmarks/results/host-step/instructions/run.sh BASE_CHECKOUT NEW_CHECKOUT OUT_DIR [METHODS] [ROWS]
# then: python benchmarks/results/host-step/instructions/compare.py OUT_DIR
BASE=$1 NEW=$2 OUT=$3 METHODS=${4:-never,always,flat} ROWS=${5:-1}  # ROWS: a batch's rows per call
PY=$(python -c "import sys; print(sys.executable)")  # the interpreter itself: valgrind does not follow a pyenv shim
mkdir -p "$OUT"
cd /tmp || exit 1  # outside both checkouts: PYTHONPATH alone picks the plugin's code
for m in ${METHODS//,/ }; do
  for v in base new; do
    if [ $v = base ]; then P=$BASE; else P=$NEW; fi
    # a fixed hash seed: dict probes (and so instructions) otherwise move by about 0.3% from run to run
    PYTHONPATH=$P PYTHONHASHSEED=0 valgrind --tool=callgrind --instr-atstart=no \
        --callgrind-out-file="$OUT/$v-$m.callgrind" "$PY" "$NEW/benchmarks/results/host-step/instructions/count.py" \
        "$m" 2 "$ROWS" > "$OUT/$v-$m.log" 2>&1
  done
done
