"""Replay: how a draft-budget policy would do on recorded greedy outputs, without running the model.

Greedy decoding is exact, so the tokens a decoder emits are plain ``generate``'s whatever the policy;
and the trie holds, before output position ``i``, exactly the prompt and the first ``i`` output
tokens however the steps were cut. So one recorded output per prompt is enough to replay any policy:
at each step the decoder's own :class:`~lookahead.drafting.policy.DraftPolicy` drafts and chooses nodes, the
decoder's own greedy walk accepts the path that matches the recorded output, and the step costs
``cost(rows)`` from a measured curve. What comes back is
noise-free: target calls, tokens per call and the modelled time against plain decoding
(``tokens * cost(1)``), prompt by prompt. A shared, noisy machine cannot tell a 3% change apart in
wall-clock time; the replay can, and ``tests/test_replay.py`` pins it to the real decoder's calls.

Record once (SmolLM2, greedy), then replay as often as wanted::

    python -m benchmarks.replay record --prompts 8 --max-new-tokens 160 --out replay.json
    python -m benchmarks.replay run replay.json     # lookahead, lookahead-fixed and prompt lookup, on the
                                                    # recorded curve, then the draft sources on a flat one
    python -m benchmarks.replay topk replay.json --out replay-topk.npz    # the rows' top-k (runs the model)
    python -m benchmarks.replay run replay.json --topk replay-topk.npz    # ... and the model's predictions

The flat curve (:data:`FLAT_CURVE`, ``t(256) / t(1) = 1.02``) is the GPU regime, where verifying 64
tokens costs about what one does: there tokens per call is the speed-up, and it measures what the
draft sources can find, whatever the machine's timing.

The model-prediction source (``Tuning.recycle_k``) learns from every verified row's logits, which a
recording lacks: the replay runs it off, or (``--topk``) from the accepted path's rows only, which
underestimates it (``benchmarks/drafts_real.py`` runs the real decoder for it).

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

import numpy as np

from lookahead._tuning import DEFAULT, Tuning
from lookahead.cache import NgramTrie
from lookahead.config import FLAT_CURVE, LookaheadConfig
from lookahead.cost import CostModel
from lookahead.drafting.policy import DraftPolicy, Limits
from lookahead.verify.sampled import greedy_verify_argmax

FLAT_METHODS = {
    "trie": {"copy_nodes": 0, "recycle_k": 0},
    "copy": {"tree_nodes": 0, "recycle_k": 0},
    "trie+copy": {"recycle_k": 0},
}
"""The draft sources compared on the flat curve (``config.FLAT_CURVE``: 64 verified tokens cost about what one
does): ``Tuning`` fields over the default. With ``run --topk`` also ``model`` (the model's predictions alone) and
``default`` (all three)."""


def _replayed(config: LookaheadConfig, tuning: Tuning | None, topk) -> tuple[LookaheadConfig, Tuning]:
    """``config`` without the window (the replay cannot run its rows) and ``tuning`` (None: the default) without
    the model's predictions unless ``topk`` is given."""
    tuning = DEFAULT if tuning is None else tuning
    return replace(config, window=0), replace(tuning, recycle_k=tuning.recycle_k if topk is not None else 0)


def replay(prompt: Sequence[int], output: Sequence[int], max_new_tokens: int, config: LookaheadConfig,
           cost: CostModel, topk: tuple[np.ndarray, np.ndarray] | None = None, tuning: Tuning | None = None,
           policy: DraftPolicy | None = None) -> dict:
    """Replay one prompt: the decoder's steps on a recorded greedy ``output`` (see the module docstring).
    ``config`` and ``tuning`` (None: the default ``Tuning``) are what ``LookaheadDecoder(config, _tuning=tuning)``
    takes.

    The very :class:`~lookahead.drafting.policy.DraftPolicy` the decoder uses drafts each step (without the
    window, whose rows the replay cannot run: its n-gram store would stay empty), and the very
    greedy walk of ``verify.py`` accepts: the model's argmax after a node of depth ``d`` is taken
    to be the recorded token ``d`` places on, which is exact for every node on the accepted path and
    never consulted elsewhere. ``cost`` prices a step of ``rows`` new tokens.

    The model's own predictions (``Tuning.recycle_k``) need every verified row's top-k, which a recording
    lacks: without ``topk`` that source is off. ``topk`` = (ids int[P + N, k], logits float[P + N, k]),
    the top-k of one forward over the prompt and output (:func:`record_topk`), position ``j``
    predicting token ``j + 1``, lets it learn from the prompt's rows (when the decoder would keep them)
    and the rows of the accepted path (the pending token's and the accepted nodes'); the decoder also
    learns from the rejected rows, so this underestimates it. Each call starts with an empty table
    (``recycle_keep`` carries it across calls of one decoder; :func:`replay_all` replays one call per prompt).
    Returns target calls
    (prefill included, as the decoder counts), tokens, the budgets chosen per step and ``speedup`` =
    plain's modelled time / the policy's, both without the prefill call (the same for both but for
    the first tree's few rows).
    """
    output = [int(t) for t in output]
    prompt = [int(t) for t in prompt]
    config, tuning = _replayed(config, tuning, topk)
    if policy is None:  # else one kept across calls, as one decoder's (its carried estimates, its tables)
        policy = DraftPolicy(config, NgramTrie(max_n=tuning.ngram_size, capacity=tuning.trie_capacity), None, tuning)
    policy.start(prompt, Limits(len(prompt) + max_new_tokens), cost if tuning.adaptive else None)
    if policy.recycle_k and policy.prompt_rows:  # the decoder keeps the prompt's rows in the first forward
        policy.learn_prompt(prompt[:-1], topk[0][: len(prompt) - 1], topk[1][: len(prompt) - 1])
    i, calls, seconds, budgets, accepted = 0, 0, 0.0, [], 0
    while i < len(output):
        length = len(prompt) + i
        draft = policy.draft(length, length, length - 1)
        argmax = [output[i + d] if i + d < len(output) else -1 for d in [0, *draft.depth.tolist()]]
        verdict = greedy_verify_argmax(argmax, draft.tokens.tolist(), draft.parents.tolist())
        emitted = output[i : i + len(verdict.nodes) + 1]
        rows = 1 + len(draft)
        successors = None
        if policy.recycle_k:  # the accepted path's rows: the pending token's, then each accepted node's
            ids = np.full((rows, topk[0].shape[1]), -1, dtype=np.int64)
            logits = np.zeros((rows, topk[0].shape[1]), dtype=np.float32)
            at = len(prompt) + i - 1  # the pending token's position
            for r, pos in zip([0, *(1 + j for j in verdict.nodes)], range(at, at + len(verdict.nodes) + 1)):
                ids[r], logits[r] = topk[0][pos], topk[1][pos]
            successors = (ids, logits)
        policy.learn(draft, verdict.nodes, emitted, None, rows, float(cost(rows)), successors)
        budgets.append(len(draft))
        if calls:  # the first call is the prefill (with the first tree): priced like plain's prefill, left out
            seconds += float(cost(rows))
        calls += 1
        accepted += min(len(verdict.nodes), len(emitted))
        i += len(emitted)
    policy.catch_up()
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


def replay_all(records: dict, config: LookaheadConfig | None, cost: CostModel, topk: dict | None = None,
               tuning: Tuning | None = None, per_workload: bool = False) -> dict:
    """Every recorded prompt; per workload the median, min and tokens/call of the modelled speed-up.
    ``config=None`` replays transformers' prompt lookup (10 tokens) instead of the decoder; ``topk``:
    per prompt id, what :func:`replay` takes (from :func:`load_topk`); ``tuning``: the decoder's constants (a
    ``Tuning``; None: the default);
    ``per_workload``: one policy per workload, kept across its prompts in recording order (one decoder serving
    one kind of request), else a fresh one per prompt."""
    kept: dict[str, DraftPolicy] = {}

    def policy_for(record):
        if not per_workload or config is None:
            return None
        if record["workload"] not in kept:
            cfg, tun = _replayed(config, tuning, topk)
            kept[record["workload"]] = DraftPolicy(cfg, NgramTrie(max_n=tun.ngram_size, capacity=tun.trie_capacity),
                                                   None, tun)
        return kept[record["workload"]]

    per_prompt = {pid: (replay(r["prompt"], r["output"], r["max_new_tokens"], config, cost,
                               topk.get(pid) if topk else None, tuning, policy_for(r)) if config
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

    from lookahead.tools.bench.runner import as_prompts, encode

    prompts = [(wl, p) for wl, items in workloads.items() for p in as_prompts(wl, items)]
    kwargs = {"max_new_tokens": max_new_tokens, "do_sample": False}  # greedy, as the bench runs plain generate
    eos = model.generation_config.eos_token_id
    if model.generation_config.pad_token_id is None and eos is not None:
        kwargs["pad_token_id"] = eos[0] if isinstance(eos, (list, tuple)) else eos
    out = {}
    for wl, p in tqdm(prompts, desc="record", disable=not progress, file=sys.stderr):
        inputs = encode(p, tokenizer, model.device)
        with torch.inference_mode():
            seq = model.generate(**inputs, **kwargs)
        n = inputs["input_ids"].shape[1]
        out[p.id] = {"workload": wl, "prompt": seq[0, :n].tolist(), "output": seq[0, n:].tolist(),
                     "max_new_tokens": max_new_tokens}
    if cost is None:  # the curve the default decoder prices with: what one short call of it reports
        from lookahead import LookaheadDecoder

        decoder = LookaheadDecoder()
        inputs = encode(prompts[0][1], tokenizer, model.device)
        with torch.inference_mode():
            model.generate(**inputs, **{**kwargs, "max_new_tokens": 2}, custom_generate=decoder)
        s = decoder.stats
        cost = CostModel(s.cost_curve, provisional=s.cost_provisional, steps=s.cost_steps)
    from lookahead.tools.bench.runner import run_context

    context = run_context(model, model_name, False, " ".join(sys.argv) if sys.argv else None)
    return {"context": context, "cost_curve": [list(p) for p in cost.points], "prompts": out}


def record_topk(model, records: dict, k: int = 8, progress: bool = True) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per prompt id: (ids int32[P + N, k], logits float16[P + N, k]), the top-k of one forward over the
    recorded prompt and output (position ``j`` predicts token ``j + 1``), for :func:`replay`'s ``topk``."""
    import torch
    from tqdm.auto import tqdm

    out = {}
    for pid, r in tqdm(records["prompts"].items(), desc="top-k", disable=not progress, file=sys.stderr):
        ids = torch.tensor([r["prompt"] + r["output"]], device=model.device)
        with torch.inference_mode():
            logits = model(input_ids=ids).logits[0].float()
        top = logits.topk(k, -1)
        out[pid] = (top.indices.to(torch.int32).cpu().numpy(), top.values.to(torch.float16).cpu().numpy())
    return out


def save_topk(path: str, topk: dict) -> None:
    np.savez_compressed(path, **{f"{pid}/ids": ids for pid, (ids, _) in topk.items()},
                        **{f"{pid}/logits": lg for pid, (_, lg) in topk.items()})


def load_topk(path: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    with np.load(path) as z:
        pids = {name.rsplit("/", 1)[0] for name in z.files}
        return {pid: (z[f"{pid}/ids"].astype(np.int64), z[f"{pid}/logits"].astype(np.float32)) for pid in pids}


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
    run = sub.add_parser("run", help="replay the default decoder, Tuning(adaptive=False) and prompt lookup, "
                                     "then the draft sources on a flat cost curve")
    run.add_argument("recording")
    run.add_argument("--topk", help="the recording's top-k (from `topk`): also replay the model's predictions")
    top = sub.add_parser("topk", help="record the top-k of one forward over each recorded prompt and output "
                                      "(runs the model), for `run --topk`")
    top.add_argument("recording")
    top.add_argument("--k", type=int, default=8)
    top.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    top.add_argument("--out", required=True, help="an .npz file")
    args = parser.parse_args(argv)
    if args.command == "topk":
        import torch

        from lookahead.tools.models import load_smollm2

        torch.set_num_threads(args.threads)
        with open(args.recording, encoding="utf-8") as f:
            data = json.load(f)
        model, _ = load_smollm2()
        topk = record_topk(model, data, args.k)
        save_topk(args.out, topk)
        agree = [float(np.mean(ids[len(r["prompt"]) - 1 : -1, 0] == r["output"]))
                 for pid, r in data["prompts"].items() for ids in [topk[pid][0]]]
        print(f"wrote {args.out}: {len(topk)} prompts, k={args.k}; the one-forward argmax is the recorded token "
              f"at {100 * float(np.mean(agree)):.2f}% of output positions")
        return 0
    if args.command == "record":
        import torch

        from lookahead.tools.bench.workloads import WORKLOADS, build_workloads
        from lookahead.tools.models import load_smollm2

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
        "lookahead-fixed": replay_all(data, LookaheadConfig(), cost, tuning=Tuning(adaptive=False)),
        "prompt-lookup": replay_all(data, None, cost),
    }
    flat = CostModel(FLAT_CURVE)
    flat_results = {name: replay_all(data, LookaheadConfig(cost_curve=FLAT_CURVE), flat, tuning=Tuning(**fields))
                    for name, fields in FLAT_METHODS.items()}
    flat_results["prompt-lookup"] = replay_all(data, None, flat)
    if args.topk:  # the model's predictions, learned from the accepted path's rows only (a lower bound)
        topk = load_topk(args.topk)
        results["lookahead+model"] = replay_all(data, LookaheadConfig(), cost, topk)
        flat_results["model"] = replay_all(data, LookaheadConfig(cost_curve=FLAT_CURVE), flat, topk,
                                           tuning=Tuning(tree_nodes=0, copy_nodes=0))
        flat_results["default"] = replay_all(data, LookaheadConfig(cost_curve=FLAT_CURVE), flat, topk)
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
