#!/bin/bash
# Alternate first_call.py between two checkouts: ab.sh OLD NEW DTYPE ROUNDS
# (OLD and NEW: checkouts whose lookahead/cache links to their own cache/, run with PYTHONPATH; run each once
# before, so that its Numba kernels are compiled. The decoder is given its own Calibrations: no kept curve is read.)
old=$1 new=$2 dtype=$3 rounds=${4:-3}
script=$(cd "$(dirname "$0")" && pwd)/first_call.py
for r in $(seq "$rounds"); do for v in old new; do
  dir=$old; [ $v = new ] && dir=$new
  out=$(cd /tmp && PYTHONPATH=$dir python "$script" "$dtype" 2>&1 | sed "s/.*\r//" | grep -E "^plain|^first-call|^curve" | tr '\n' ' ')
  echo "round $r $v $out"
done; done
