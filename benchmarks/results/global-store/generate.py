"""The model's own greedy answers to the direct requests of the heads' topic list (lookahead/data/topics.txt), as
token ids, for an n-gram store of what this model tends to write. Every 10th topic is held out (not written).

    python benchmarks/results/global-store/generate.py OUT.npz [MAX_NEW_TOKENS] [DTYPE]
"""
import sys
import time

import numpy as np
import torch

from lookahead.heads_train import direct_request, left_padded, read_topics, trim_at_eos
from lookahead.models import load_smollm2

torch.set_num_threads(2)
out = sys.argv[1]
max_new = int(sys.argv[2]) if len(sys.argv) > 2 else 192
dtype = getattr(torch, sys.argv[3] if len(sys.argv) > 3 else "bfloat16")
model, tok = load_smollm2(dtype=dtype)
topics = [t for n, t in enumerate(read_topics()) if n % 10 != 9]
texts = [direct_request(*t) for t in topics]
eos = {tok.eos_token_id, *(model.generation_config.eos_token_id if isinstance(model.generation_config.eos_token_id, list) else [model.generation_config.eos_token_id])}
seqs, t0 = [], time.perf_counter()
for a in range(0, len(texts), 16):
    ids, mask = left_padded(tok, texts[a:a + 16], True, "cpu")
    with torch.no_grad():
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                             pad_token_id=tok.pad_token_id or tok.eos_token_id)
    new = gen[:, ids.shape[1]:].numpy()
    for b in range(new.shape[0]):
        seqs.append(new[b, :trim_at_eos(new[b], eos)])
    print(f"{len(seqs)}/{len(texts)} {time.perf_counter() - t0:.0f} s", flush=True)
np.savez(out, lengths=np.array([len(s) for s in seqs]), tokens=np.concatenate(seqs))
print("tokens", sum(len(s) for s in seqs))
