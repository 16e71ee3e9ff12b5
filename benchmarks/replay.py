"""Replay: how a draft-budget policy would do on recorded greedy outputs, without running the model.

Greedy decoding is exact, so the tokens a decoder emits are plain ``generate``'s whatever the policy;
and the trie holds, before output position ``i``, exactly the prompt and the first ``i`` output
tokens however the steps were cut. So one recorded output per prompt is enough to replay any policy:
at each step the decoder's own :class:`~lookahead.policy.DraftPolicy` drafts and chooses nodes, the
decoder's own greedy walk accepts the path that matches the recorded output, and the step costs
``cost(rows)`` from a measured curve. What comes back is
noise-free: target calls, tokens per call and the modelled time against plain decoding
(``tokens * cost(1)``), prompt by prompt. A shared, noisy machine cannot tell a 3% change apart in
wall-clock time; the replay can, and ``tests/test_replay.py`` pins it to the real decoder's calls.

Record once (SmolLM2, greedy), then replay as often as wanted::

    python -m benchmarks.replay record --prompts 8 --max-new-tokens 160 --out replay.json
    python -m benchmarks.replay run replay.json     # lookahead, lookahead-fixed and prompt lookup, on the
                                                    # recorded curve, then the draft sources on a flat one

The flat curve (:data:`FLAT_CURVE`, ``t(256) / t(1) = 1.02``) is the GPU regime, where verifying 64
tokens costs about what one does: there tokens per call is the speed-up, and it measures what the
draft sources can find, whatever the machine's timing.

Worked example: output ``[5, 6, 7]``, a step that drafts the chain ``5 -> 6 -> 9`` accepts ``5, 6``
(``9`` differs from ``7``) and emits ``5, 6, 7`` (7 from the last accepted node's logits): one call,
cost ``cost(4)``, against plain decoding's ``3 * cost(1)``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import replace

from lookahead.cache import NgramTrie
from lookahead.config import LookaheadConfig
from lookahead.cost import CostModel
from lookahead.policy import DraftPolicy, Limits
from lookahead.verify import greedy_verify_argmax

FLAT_CURVE = ((1, 0.010), (2, 0.010), (256, 0.0102))
"""A GPU-like cost curve: 64 verified tokens cost about what one does (``DESIGN.md``, reporting a result)."""

FLAT_METHODS = {
    "lookahead": {},
    "trie-only": {"copy_nodes": 0},
    "copy-only": {"tree_nodes": 0},
}
"""The draft sources compared on the flat curve: ``LookaheadConfig`` fields over the default."""


def replay(prompt: Sequence[int], output: Sequence[int], max_new_tokens: int, config: LookaheadConfig,
           cost: CostModel) -> dict:
    """Replay one prompt: the decoder's steps on a recorded greedy ``output`` (see the module docstring).

    The very :class:`~lookahead.policy.DraftPolicy` the decoder uses drafts each step (without the
    window, whose rows the replay cannot run: its n-gram store would stay empty), and the very
    greedy walk of ``verify.py`` accepts: the model's argmax after a node of depth ``d`` is taken
    to be the recorded token ``d`` places on, which is exact for every node on the accepted path and
    never consulted elsewhere. ``cost`` prices a step of ``rows`` new tokens. Returns target calls
    (prefill included, as the decoder counts), tokens, the budgets chosen per step and ``speedup`` =
    plain's modelled time / the policy's, both without the prefill call (the same for both but for
    the first tree's few rows).
    """
    output = [int(t) for t in output]
    prompt = [int(t) for t in prompt]
    config = replace(config, window_width=0)
    policy = DraftPolicy(config, NgramTrie(max_n=config.ngram_size, capacity=config.trie_capacity))
    policy.start(prompt, Limits(len(prompt) + max_new_tokens), cost if config.adaptive else None)
    i, calls, seconds, budgets, accepted = 0, 0, 0.0, [], 0
    while i < len(output):
        length = len(prompt) + i
        draft = policy.draft(length, length, length - 1)
        argmax = [output[i + d] if i + d < len(output) else -1 for d in [0, *draft.depth.tolist()]]
        verdict = greedy_verify_argmax(argmax, draft.tokens.tolist(), draft.parents.tolist())
        emitted = output[i : i + len(verdict.nodes) + 1]
        rows = 1 + len(draft)
        policy.learn(draft, verdict.nodes, emitted, None, rows, float(cost(rows)))
        budgets.append(len(draft))
        if calls:  # the first call is the prefill (with the first tree): priced like plain's prefill, left out
            seconds += float(cost(rows))
        calls += 1
        accepted += min(len(verdict.nodes), len(emitted))
        i += len(emitted)
    plain = (len(output) - 1) * float(cost(1))
    return {"target_calls": calls, "new_tokens": len(output), "tokens_per_call": len(output) / calls,
            "accepted": accepted, "budgets": budgets, "seconds": seconds,
            "speedup": plain / seconds if seconds else 1.0}  # one-call outputs: nothing to compare


def prompt_lookup_draft(sequence: Sequence[int], num_tokens: int = 10, max_ngram: int = 2) -> list[int]:
    """The chain transformers' prompt lookup (``prompt_lookup_num_tokens``) drafts after ``sequence``.

    As ``PromptLookupCandidateGenerator``: the last ``max_ngram`` tokens (then fewer) are looked up
    left to right; the first earlier occurrence with a continuation gives up to ``num_tokens`` tokens.
    Example: ``[1, 2, 3, 9, 1, 2]`` -> matches ``1 2`` at 0 -> ``[3, 9, 1, 2]``.
    """
    seq = list(sequence)
    n = len(seq)
    for size in range(min(max_ngram, n - 1), 0, -1):
        tail = seq[n - size:]
        for start in range(n - size + 1):
            if seq[start : start + size] == tail and start + size < n:
                return seq[start + size : min(start + size + num_tokens, n)]
    return []


def replay_prompt_lookup(prompt: Sequence[int], output: Sequence[int], max_new_tokens: int, cost: CostModel,
                         num_tokens: int = 10) -> dict:
    """:func:`replay` for transformers' prompt lookup: one drafted chain per step, all of it verified.
    (Its Python overhead per step is not modelled: the wall-clock benchmark has it.)"""
    output = [int(t) for t in output]
    seq = [int(t) for t in prompt]
    i, calls, seconds, accepted = 0, 0, 0.0, 0
    while i < len(output):
        chain = prompt_lookup_draft(seq, num_tokens)[: max(max_new_tokens - i - 1, 0)]
        n_acc = 0
        while n_acc < len(chain) and i + n_acc < len(output) and chain[n_acc] == output[i + n_acc]:
            n_acc += 1
        emitted = output[i : i + n_acc + 1]
        if calls:
            seconds += float(cost(1 + len(chain)))
        calls += 1
        accepted += min(n_acc, len(emitted))
        seq.extend(emitted)
        i += len(emitted)
    plain = (len(output) - 1) * float(cost(1))
    return {"target_calls": calls, "new_tokens": len(output), "tokens_per_call": len(output) / calls,
            "accepted": accepted, "seconds": seconds, "speedup": plain / seconds if seconds else 1.0}


def replay_all(records: dict, config: LookaheadConfig | None, cost: CostModel) -> dict:
    """Every recorded prompt; per workload the median, min and tokens/call of the modelled speed-up.
    ``config=None`` replays transformers' prompt lookup (10 tokens) instead of the decoder."""
    per_prompt = {pid: (replay(r["prompt"], r["output"], r["max_new_tokens"], config, cost) if config
                        else replay_prompt_lookup(r["prompt"], r["output"], r["max_new_tokens"], cost))
                  for pid, r in records["prompts"].items()}
    summary = {}
    for wl in dict.fromkeys(r["workload"] for r in records["prompts"].values()):
        ids = [pid for pid, r in records["prompts"].items() if r["workload"] == wl]
        ratios = [per_prompt[p]["speedup"] for p in ids]
        summary[wl] = {"prompts": len(ids), "speedup_median": statistics.median(ratios), "speedup_min": min(ratios),
                       "tokens_per_call": sum(per_prompt[p]["new_tokens"] for p in ids)
                       / sum(per_prompt[p]["target_calls"] for p in ids)}
    return {"per_prompt": per_prompt, "summary": summary}


def record(model, tokenizer, workloads: dict, max_new_tokens: int, cost: CostModel | None = None,
           progress: bool = True, model_name: str | None = None) -> dict:
    """Plain greedy outputs of every prompt, plus the model's cost curve: the input of :func:`replay_all`."""
    import torch
    from tqdm.auto import tqdm

    from lookahead.bench.runner import _generate_kwargs, as_prompts, encode

    prompts = [(wl, p) for wl, items in workloads.items() for p in as_prompts(wl, items)]
    out = {}
    for wl, p in tqdm(prompts, desc="record", disable=not progress, file=sys.stderr):
        inputs = encode(p, tokenizer, model.device)
        with torch.inference_mode():
            seq = model.generate(**inputs, **_generate_kwargs(model, max_new_tokens, False))
        n = inputs["input_ids"].shape[1]
        out[p.id] = {"workload": wl, "prompt": seq[0, :n].tolist(), "output": seq[0, n:].tolist(),
                     "max_new_tokens": max_new_tokens}
    if cost is None:
        from lookahead import LookaheadDecoder

        with torch.inference_mode():
            cost = LookaheadDecoder().cost_curve(model)  # the curve the default decoder would price with
    from lookahead.bench.runner import run_context

    context = run_context(model, model_name, False, " ".join(sys.argv) if sys.argv else None)
    return {"context": context, "cost_curve": [list(p) for p in cost.points], "prompts": out}


def _table(results: dict[str, dict]) -> str:
    lines = ["| workload | method | prompts | modelled speed-up (median) | min | tokens/call |",
             "|---|---|---:|---:|---:|---:|"]
    first = next(iter(results.values()))
    for wl in first["summary"]:
        for name, result in results.items():
            s = result["summary"][wl]
            lines.append(f"| {wl} | {name} | {s['prompts']} | {s['speedup_median']:.2f}x | {s['speedup_min']:.2f}x | "
                         f"{s['tokens_per_call']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replay", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record plain greedy outputs and the cost curve (runs the model)")
    rec.add_argument("--prompts", type=int, default=8, help="prompts per workload (default 8)")
    rec.add_argument("--max-new-tokens", type=int, default=160)
    rec.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    rec.add_argument("--out", default="replay.json")
    run = sub.add_parser("run", help="replay the default LookaheadConfig, adaptive=False and prompt lookup, "
                                     "then the draft sources on a flat cost curve")
    run.add_argument("recording")
    args = parser.parse_args(argv)
    if args.command == "record":
        import torch

        from lookahead.bench.workloads import WORKLOADS, build_workloads
        from lookahead.models import load_smollm2

        torch.set_num_threads(args.threads)
        model, tok = load_smollm2()
        data = record(model, tok, build_workloads(list(WORKLOADS), args.prompts), args.max_new_tokens,
                      model_name="SmolLM2-135M-Instruct (bundled, GGUF Q4_1 weights dequantised)")
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(data, f)
        print(f"wrote {args.out}: {len(data['prompts'])} prompts; cost curve {CostModel(data['cost_curve'])}")
        return 0
    with open(args.recording, encoding="utf-8") as f:
        data = json.load(f)
    cost = CostModel(data["cost_curve"])
    results = {
        "lookahead": replay_all(data, LookaheadConfig(), cost),
        "lookahead-fixed": replay_all(data, LookaheadConfig(adaptive=False), cost),
        "prompt-lookup": replay_all(data, None, cost),
    }
    flat = CostModel(FLAT_CURVE)
    flat_results = {name: replay_all(data, LookaheadConfig(cost_curve=FLAT_CURVE, **fields), flat)
                    for name, fields in FLAT_METHODS.items()}
    flat_results["prompt-lookup"] = replay_all(data, None, flat)
    ctx = data.get("context") or {}
    if ctx:
        model, hw = ctx["model"], ctx["hardware"]
        print(f"recording: {model['name']} ({model['dtype']}, {model['device']}), {hw.get('gpu') or hw['cpu']} "
              f"(torch threads: {hw['torch_threads']}), {len(data['prompts'])} prompts, greedy; {ctx['started_at']}")
    print(f"cost curve: {cost}")
    print(_table(results))
    print(f"\nflat cost curve (GPU regime, tokens per call = speed-up): {flat}")
    print(_table(flat_results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
