"""Train one heads variant on a training run's shards and report held-out and training accuracy (overfitting).

    PYTHONPATH=. python benchmarks/results/context-head/train_variant.py /tmp/heads-run OUT_DIR context \
        dropout=0.2 wd=0.1 [steps=1200 vocab=4096 lr=1e-3 rows=256 ffn=2 K=4 threads=1]

The shards are those ``python -m lookahead train-heads --out RUN`` wrote (``RUN/work/shards``); the split, the
vocabulary rule, the schedule, the calibration and the held-out report are the training run's own
(``lookahead.heads_train``); only the named settings change. Writes ``OUT_DIR/KIND`` (``DraftHeads.save``).
"""

import os
import sys
import tempfile
import time

import torch

from lookahead.heads import DraftHeads
from lookahead.heads_train import ShardStore, calibrate, evaluate, train_heads, vocab_by_frequency
from lookahead.models import load_smollm2


def main() -> None:
    run, out, kind = sys.argv[1:4]
    kw = dict(a.split("=") for a in sys.argv[4:])
    torch.set_num_threads(int(kw.get("threads", 1)))
    model, _ = load_smollm2(dtype=torch.float32)
    store = ShardStore(os.path.join(run, "work", "shards"))
    with tempfile.TemporaryDirectory() as tmp:
        train = store.rows("train", os.path.join(tmp, "train.npy"))
        held = store.rows("held-out", os.path.join(tmp, "held.npy"))
        eos = model.generation_config.eos_token_id
        eos = [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None]
        vocab = vocab_by_frequency(train.tokens, int(kw.get("vocab", 4096)), always=eos)
        torch.manual_seed(0)
        heads = DraftHeads.for_model(model, kind, int(kw.get("K", 4)), vocab, dropout=float(kw.get("dropout", 0.0)),
                                     ffn=int(kw.get("ffn", 2)))
        t = time.perf_counter()
        train_heads(heads, train, model, int(kw.get("steps", 1200)), int(kw.get("rows", 256)), float(kw.get("lr", 1e-3)),
                    0, 0.5, False, weight_decay=float(kw.get("wd", 0.0)))
        calibrate(heads, held, model)
        acc = evaluate(heads, held, model)
        fit = evaluate(heads, train, model, max_rows=4000)
    heads.trained_on = {"variant": " ".join(sys.argv[3:]), "held_out_accuracy": acc}
    heads.save(os.path.join(out, kind))
    print(f"{' '.join(sys.argv[3:])}: {time.perf_counter() - t:.0f} s; held-out top-1 {acc['top1']} chain {acc['chain']}; "
          f"training rows top-1 {fit['top1']} chain {fit['chain']}")


if __name__ == "__main__":
    main()
