cd /work/main
for r in 1 2 3 4; do for v in old new; do
  if [ $v = old ]; then git stash push lookahead/decoder.py -q; fi
  out=$(LOOKAHEAD_PERSIST=0 python benchmarks/results/step-pricing/first_call_own_model.py 896 4864 24 2>&1 | sed 's/.*\r//' | grep -E "^plain|^first decoder|^calibration " | tr '\n' ' ')
  if [ $v = old ]; then git stash pop -q; fi
  echo "round $r $v $out"
done; done
