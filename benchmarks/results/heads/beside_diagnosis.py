"""Where the heads draft beside the other sources: per prompt, the default decoder with and without the bundled
heads (fp32 model, the kept CPU curve), twice each.

    python benchmarks/results/heads/beside_diagnosis.py code-editing 4

Per run: time, target calls, tokens per call, the heads' seconds, the steps where the heads proposed a tree (and of
those, with another source's tree beside it), where the budget verified heads' nodes and where one was accepted,
and the accepted tokens by origin. Apply ``beside-pricing.patch`` to see the rule that was tried.
"""

import sys
import time
from collections import Counter

import torch

from lookahead import LookaheadDecoder
from lookahead import policy as policy_module
from lookahead import stats as stats_module
from lookahead.bench.runner import encode
from lookahead.bench.workloads import build_workloads
from lookahead.draft import ORIGINS
from lookahead.heads import DraftHeads, HeadsSource
from lookahead.models import load_smollm2

HEADS = ORIGINS.index("heads")
steps: list[dict] = []


def spy() -> None:
    """Record each step's proposing origins (the merge) and its verified and accepted nodes' origins."""
    merge, record = policy_module.merge_proposals, stats_module.DecodeStats.record_step

    def merging(proposals, *args, **kwargs):
        steps.append({"proposed": [origin for origin, _ in proposals]})
        return merge(proposals, *args, **kwargs)

    def recording(self, draft, accepted, emitted, *args):
        if steps:
            steps[-1]["verified"] = Counter(draft.origin.tolist())
            steps[-1]["accepted"] = Counter(draft.origin[accepted].tolist()) if len(accepted) else Counter()
        return record(self, draft, accepted, emitted, *args)

    policy_module.merge_proposals = merging
    stats_module.DecodeStats.record_step = recording


def main(workload: str, prompts: int) -> None:
    torch.set_num_threads(2)
    model, tok = load_smollm2(dtype=torch.float32)
    heads = DraftHeads.bundled()
    spy()
    items = build_workloads([workload], prompts)[workload]
    model.generate(**encode(items[0], tok, "cpu"), max_new_tokens=16, do_sample=False,
                   custom_generate=LookaheadDecoder(heads=heads))
    for p in items:
        enc = encode(p, tok, "cpu")
        for name in ("lookahead", "heads", "lookahead", "heads"):
            decoder = LookaheadDecoder(heads=heads) if name == "heads" else LookaheadDecoder()
            steps.clear()
            t = time.perf_counter()
            model.generate(**enc, max_new_tokens=128, do_sample=False, custom_generate=decoder)
            elapsed = time.perf_counter() - t
            s = decoder.stats
            source = next((x for x in decoder.policy.sources if isinstance(x, HeadsSource)), None)
            proposed = [x for x in steps if HEADS in x["proposed"]]
            verified = [x for x in proposed if x.get("verified", {}).get(HEADS)]
            accepted = [x for x in verified if x["accepted"].get(HEADS)]
            print(f"{p.id:20s} {name:9s} {elapsed:5.2f}s calls {s.target_calls} tokens/call "
                  f"{s.new_tokens / s.target_calls:.2f} heads {source.stats.seconds if source else 0:.2f}s proposed "
                  f"{len(proposed)} (beside others {sum(len(x['proposed']) > 1 for x in proposed)}) verified "
                  f"{len(verified)} accepted {len(accepted)} by origin {dict(s.accepted_by_origin)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
