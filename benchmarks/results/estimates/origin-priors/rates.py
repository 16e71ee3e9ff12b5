"""Raw acceptance counts per (origin, agreement, match bucket, depth, rank) over decodes (no decay).

    PYTHONPATH=. python benchmarks/results/estimates/origin-priors/rates.py heads|none flat|default SKIP OUT.npz
    PYTHONPATH=. python benchmarks/results/estimates/origin-priors/show.py OUT.npz

SmolLM2-135M (bundled), fp32, one thread, 128 new tokens, greedy, 8 prompts of each of code completion, code
editing and chat (after the first SKIP), a fresh decoder per prompt; ``flat``: the flat cost curve of
``benchmarks.heads``; ``heads``: the bundled feature heads, their cost pinned at 0.3 ms + 0.1 ms per level. A node
counts as tried when its parent was accepted (or it is a root child), as ``kernels.record`` counts it.
"""
import sys
import numpy as np, torch
from benchmarks.heads import FLAT_CURVE
from lookahead import LookaheadConfig, LookaheadDecoder
from lookahead.bench.runner import encode
from lookahead.bench.workloads import build_workloads
from lookahead.budget import Budget
from lookahead.heads import DraftHeads
from lookahead.models import load_smollm2
torch.set_num_threads(1)
heads_on, curve, skip, out = sys.argv[1] == "heads", sys.argv[2], int(sys.argv[3]), sys.argv[4]
model, tok = load_smollm2(dtype=torch.float32)
T = np.zeros((16, 4, 3, 16, 4)); A = np.zeros_like(T)  # origin, agreement (0..3), match bucket, depth, rank
orig = Budget.record
def record(self, draft, accepted_nodes, *a, **k):
    acc = set(int(j) for j in accepted_nodes)
    for i in range(len(draft.tokens)):
        p = int(draft.parents[i])
        if p < 0 or p in acc:
            c = (int(draft.origin[i]), min(int(draft.agreement[i]), 3), min(max(int(draft.match[i]), 1), 3) - 1,
                 min(int(draft.depth[i]) - 1, 15), min(int(draft.rank[i]), 3))
            T[c] += 1; A[c] += i in acc
    return orig(self, draft, accepted_nodes, *a, **k)
Budget.record = record
names = ["code-completion", "code-editing", "chat"]
seen = build_workloads(names, skip) if skip else {}
for wl, prompts in build_workloads(names, 8 + skip).items():
    skipped = {p.id for p in seen.get(wl, [])}
    for p in [p for p in prompts if p.id not in skipped][:8]:
        inputs = encode(p, tok, "cpu")
        heads = DraftHeads.bundled("feature", cost=(0.0003, 0.0001)) if heads_on else None
        cfg = LookaheadConfig(cost_curve=FLAT_CURVE) if curve == "flat" else LookaheadConfig()
        model.generate(**inputs, max_new_tokens=128, do_sample=False, custom_generate=LookaheadDecoder(cfg, heads=heads))
        print(wl, p.id, int(T.sum()), int(A.sum()), flush=True)
np.savez_compressed(out, tried=T, accepted=A)
