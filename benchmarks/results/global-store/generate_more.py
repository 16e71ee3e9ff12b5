"""More of the model's own greedy answers: to the questions it writes itself about each topic of the heads' topic list
(``heads_train.write_prompts``: sampled, seeded, as ``train-heads`` writes them). Held-out topics (every 10th) are
left out. Same output format as generate.py.

    python benchmarks/results/global-store/generate_more.py OUT.npz [MAX_NEW_TOKENS] [QUESTIONS]
"""
import sys
import time

import numpy as np
import torch

from lookahead.heads_train import TrainSettings, left_padded, read_topics, trim_at_eos, write_prompts
from lookahead.models import load_smollm2

torch.set_num_threads(1)
out = sys.argv[1]
max_new = int(sys.argv[2]) if len(sys.argv) > 2 else 192
questions = int(sys.argv[3]) if len(sys.argv) > 3 else 3
model, tok = load_smollm2(dtype=torch.bfloat16)
eos_cfg = model.generation_config.eos_token_id
eos = sorted({tok.eos_token_id, *(eos_cfg if isinstance(eos_cfg, list) else [eos_cfg])} - {None})
pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
items = write_prompts(model, tok, read_topics(), TrainSettings(questions=questions, batch_size=32), True, eos, pad)
items = [it for it in items if it["split"] == "train" and "-q" in it["id"]]
print("questions", len(items), flush=True)
seqs, t0 = [], time.perf_counter()
for a in range(0, len(items), 16):
    ids, mask = left_padded(tok, [it["text"] for it in items[a:a + 16]], True, "cpu")
    with torch.no_grad():
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False, pad_token_id=pad)
    new = gen[:, ids.shape[1]:].numpy()
    for b in range(new.shape[0]):
        seqs.append(new[b, :trim_at_eos(new[b], eos)])
    print(f"{len(seqs)}/{len(items)} {time.perf_counter() - t0:.0f} s", flush=True)
np.savez(out, lengths=np.array([len(s) for s in seqs]), tokens=np.concatenate(seqs),
         prompts=np.array([it["text"] for it in items]))
print("tokens", sum(len(s) for s in seqs))
