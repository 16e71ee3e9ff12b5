"""A successor table (recycle.SuccessorTable) filled from the model's own rows over its answers to the topic list's
direct requests (generate.py's output): the model's top-k successors at each answer position, keyed as a call's
verified rows are. Pickled for model_prior.py / store_eval.py.

    python benchmarks/results/global-store/prior_table.py ANSWERS.npz OUT.pkl [K]
"""
import pickle
import sys

import numpy as np
import torch

from lookahead.heads_train import direct_request, left_padded, read_topics
from lookahead.models import load_smollm2
from lookahead.recycle import SuccessorTable

torch.set_num_threads(2)
data = np.load(sys.argv[1])
k = int(sys.argv[3]) if len(sys.argv) > 3 else 8
model, tok = load_smollm2(dtype=torch.float32)
topics = [t for n, t in enumerate(read_topics()) if n % 10 != 9]
table = SuccessorTable(k)
a, rows = 0, 0
for topic, n in zip(topics, data["lengths"]):
    answer = data["tokens"][a:a + n]
    a += n
    ids, _ = left_padded(tok, [direct_request(*topic)], True, "cpu")
    seq = torch.cat([ids[0], torch.as_tensor(answer)])
    with torch.no_grad():
        logits = model(seq[None]).logits[0, ids.shape[1] - 1 : -1].float()  # rows whose input is the answer's tokens
    vals, top = logits.topk(k, dim=-1)
    inputs = seq[ids.shape[1] - 1 : -1].numpy()
    prevs = seq[ids.shape[1] - 2 : -2].numpy()
    table.update(prevs, inputs, top.numpy(), vals.numpy())
    rows += len(inputs)
with open(sys.argv[2], "wb") as f:
    pickle.dump(table, f)
print("rows", rows, "keys", len(table))
