"""The side-by-side runner: every method on the same prompt back to back, prompt by prompt.

``run_bench(model, tokenizer, workloads, methods, ...)`` takes a loaded model (any causal LM; a tiny
random one in the tests) and workloads as lists of prompts (``Prompt``, chat text, or token ids with
``tokenizer=None``) and returns one JSON-safe dict with every figure and the run's context:

- per prompt and method: wall time, new tokens, target-model calls (counted the same way for every
  method, with a forward pre-hook on the model), tokens per call, the decoder's own stats, and for
  greedy runs whether the output is identical to plain ``generate`` (if not: where it first differs
  and the top-2 logit gap of plain's choice there, to tell a near-tie from a bug);
- the speed ratio against plain, prompt by prompt: (method tokens/s) / (plain tokens/s);
- per workload and method: median and spread of that ratio, tokens/call, accepted-length histogram.

The methods' order is rotated from prompt to prompt so that none always runs first; a warm-up call of
every method (on the first prompt, short output) runs before the measured ones and is excluded.
With ``repeats=R`` every prompt runs R rounds of all methods (the order rotated each round, a fresh
instance each time); a method's time on the prompt is the median of its R runs, so that one burst of
other work on a shared machine does not decide a prompt's ratio.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timezone

import torch

from .methods import BASELINE, Method, make_methods
from .workloads import Prompt

SAMPLING = {"temperature": 0.7, "top_p": 0.9}
WARMUP_TOKENS = 16


class CallCounter:
    """Counts forward calls of a model (a forward pre-hook on its top-level module)."""

    def __init__(self, model):
        self.count = 0
        self._handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        self.count += 1

    def remove(self) -> None:
        self._handle.remove()


def as_prompts(workload: str, items: Sequence) -> list[Prompt]:
    """Prompts from ``Prompt`` objects, chat strings or token-id sequences."""
    out = []
    for i, item in enumerate(items):
        if isinstance(item, Prompt):
            out.append(item)
        elif isinstance(item, str):
            out.append(Prompt(id=f"{workload}-{i}", text=item))
        else:
            ids = item.tolist() if isinstance(item, torch.Tensor) else list(item)
            out.append(Prompt(id=f"{workload}-{i}", ids=tuple(int(t) for t in ids)))
    return out


def encode(prompt: Prompt, tokenizer, device) -> dict:
    """generate() inputs of one prompt."""
    if prompt.ids is not None:
        ids = torch.tensor([list(prompt.ids)], dtype=torch.long, device=device)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if tokenizer is None:
        raise ValueError(f"prompt {prompt.id!r} is text but no tokenizer was given")
    if prompt.chat and getattr(tokenizer, "chat_template", None):
        from lookahead.demo import chat_inputs

        return chat_inputs(tokenizer, prompt.text, device)
    enc = tokenizer(prompt.text, return_tensors="pt")
    return {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}


def _sync(device) -> None:
    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize(device)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _loadavg() -> list[float] | None:
    """1, 5 and 15 minute load averages: other work on the machine skews wall-clock figures."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _git_state() -> dict | None:
    """Commit of the lookahead checkout and its uncommitted files, when run from a git checkout."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10, check=True).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "modified": [line[3:] for line in dirty if line.strip()]}


def run_context(model, model_name: str | None, sample: bool, command: str | None = None) -> dict:
    import numpy
    import transformers

    import lookahead

    device = model.device
    ctx = {
        "model": {
            "name": model_name or getattr(model.config, "name_or_path", None) or type(model).__name__,
            "class": type(model).__name__,
            "model_type": getattr(model.config, "model_type", None),
            "parameters": sum(p.numel() for p in model.parameters()),
            "dtype": str(model.dtype).replace("torch.", ""),
            "device": str(device),
        },
        "hardware": {
            "cpu": cpu_name(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "load_average_at_start": _loadavg(),
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "numpy": numpy.__version__,
            "lookahead": getattr(lookahead, "__version__", None),
            "platform": platform.platform(),
            "git": _git_state(),
        },
        "mode": "sampled" if sample else "greedy",
        "exact": (
            "exact: every output is compared token by token with plain generate"
            if not sample
            else "exact in distribution by construction (not checkable prompt by prompt)"
        ),
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command or (" ".join(sys.argv) if sys.argv else None),
    }
    return ctx


def _generate_kwargs(model, max_new_tokens: int, sample: bool) -> dict:
    kw = {"max_new_tokens": max_new_tokens, "do_sample": sample}
    if sample:
        kw.update(SAMPLING)
    gc = model.generation_config
    if gc.pad_token_id is None and gc.eos_token_id is not None:
        eos = gc.eos_token_id
        kw["pad_token_id"] = eos[0] if isinstance(eos, (list, tuple)) else eos
    return kw


def _mismatch(model, plain_seq, other_seq, prompt_len: int, tokenizer) -> dict:
    """Where a greedy output first differs from plain, and plain's top-2 logit gap there."""
    a, b = plain_seq[0].tolist(), other_seq[0].tolist()
    k = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
    info = {"first_difference": k - prompt_len, "plain_length": len(a) - prompt_len,
            "method_length": len(b) - prompt_len}
    if k < min(len(a), len(b)):
        with torch.no_grad():
            logits = model(input_ids=plain_seq[:, :k]).logits[0, -1].float()
        top2 = torch.topk(logits, 2)
        info.update(
            plain_token=a[k], method_token=b[k],
            top2_gap=float(top2.values[0] - top2.values[1]),
            method_token_gap=float(logits.max() - logits[b[k]]),
        )
        if tokenizer is not None:
            info["plain_text_near"] = tokenizer.decode(a[max(prompt_len, k - 8): k + 8])
            info["method_text_near"] = tokenizer.decode(b[max(prompt_len, k - 8): k + 8])
    return info


def _quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def summarise(records: list[dict], workloads: list[str], methods: list[str], sample: bool) -> list[dict]:
    """Per workload (and over all workloads, as "all") and method: speed-up median and spread, etc."""
    rows = []
    for wl in [*workloads, "all"]:
        for m in methods:
            recs = [r for r in records if r["method"] == m and (wl == "all" or r["workload"] == wl)]
            ok = [r for r in recs if r["status"] == "ok"]
            row = {"workload": wl, "method": m, "prompts": len(ok),
                   "status": "ok" if ok else ("unsupported" if recs else "no prompts")}
            if ok:
                ratios = [r["speedup_vs_plain"] for r in ok if r["speedup_vs_plain"] is not None]
                tokens = sum(r["new_tokens"] for r in ok)
                calls = sum(r["target_calls"] for r in ok)
                wall = sum(r["wall_s"] for r in ok)
                hist: Counter = Counter()
                for r in ok:
                    hist.update({int(k): v for k, v in (r.get("accepted_hist") or {}).items()})
                q1, q3 = _quartiles(ratios) if ratios else (None, None)
                row.update(
                    speedup_median=statistics.median(ratios) if ratios else None,
                    speedup_min=min(ratios) if ratios else None,
                    speedup_max=max(ratios) if ratios else None,
                    speedup_q1=q1, speedup_q3=q3,
                    new_tokens=tokens, target_calls=calls,
                    tokens_per_call=tokens / calls if calls else None,
                    calls_per_token=calls / tokens if tokens else None,
                    tokens_per_s=tokens / wall if wall else None,
                    ms_per_call=1000 * wall / calls if calls else None,
                    wall_s=wall,
                    identical=(None if sample else sum(bool(r["identical_to_plain"]) for r in ok)),
                    accepted_hist={k: hist[k] for k in sorted(hist)} or None,
                )
            rows.append(row)
    return rows


def run_bench(
    model,
    tokenizer,
    workloads: dict[str, Sequence],
    methods: Sequence[str] | Sequence[Method] = ("plain", "prompt-lookup", "lookahead"),
    max_new_tokens: int = 128,
    sample: bool = False,
    seed: int = 0,
    warmup: bool = True,
    progress: bool = True,
    model_name: str | None = None,
    command: str | None = None,
    fresh_per_prompt: bool = True,
    repeats: int = 1,
) -> dict:
    """Run every method on every prompt, back to back; see the module docstring for what comes back.

    ``fresh_per_prompt``: give every prompt a new instance of each method (``Method.fresh()``), so that a
    prompt's figures do not depend on the prompts before it; ``False`` keeps one instance per method for
    the whole run, so decoders carry what they keep across calls (a shared trie) from prompt
    to prompt, in the order run. ``repeats``: rounds of all methods per prompt (see the module docstring).
    """
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if methods and all(isinstance(m, Method) for m in methods):
        method_objs = list(methods)
        if not any(m.name == BASELINE for m in method_objs):
            raise ValueError(f"the methods must include the {BASELINE!r} baseline")
        method_objs.sort(key=lambda m: m.name != BASELINE)
    else:
        method_objs = make_methods(list(methods))
    names = [m.name for m in method_objs]
    prompts = {wl: as_prompts(wl, items) for wl, items in workloads.items()}
    prompts = {wl: ps for wl, ps in prompts.items() if ps}
    if not prompts:
        raise ValueError("no prompts to run")
    device = model.device
    base_kw = _generate_kwargs(model, max_new_tokens, sample)
    context = run_context(model, model_name, sample, command)
    unsupported: dict[str, str] = {}
    counter = CallCounter(model)
    t_start = time.perf_counter()

    def call(method: Method, inputs: dict, kw: dict):
        """(output ids, seconds, target calls) or None when the method refuses this mode."""
        if method.name in unsupported:
            return None
        counter.count = 0
        _sync(device)
        t0 = time.perf_counter()
        try:
            with torch.inference_mode():
                out = model.generate(**inputs, **kw, **method.kwargs())
        except ValueError as err:
            if not sample:
                raise
            unsupported[method.name] = f"{type(err).__name__}: {err}"
            return None
        _sync(device)
        return out, time.perf_counter() - t0, counter.count

    records: list[dict] = []
    try:
        if warmup:
            first = next(iter(prompts.values()))[0]
            inputs = encode(first, tokenizer, device)
            for m in method_objs:
                call(m.fresh() if fresh_per_prompt else m, inputs,
                     {**base_kw, "max_new_tokens": min(WARMUP_TOKENS, max_new_tokens)})

        total = sum(len(ps) for ps in prompts.values()) * len(method_objs) * repeats
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="bench", unit="run", disable=not progress, file=sys.stderr)
        index = 0
        for wl, ps in prompts.items():
            for prompt in ps:
                inputs = encode(prompt, tokenizer, device)
                prompt_len = inputs["input_ids"].shape[1]
                outs, recs = {}, {}
                for rnd in range(repeats):
                    shift = (index + rnd) % len(method_objs)
                    order = method_objs[shift:] + method_objs[:shift]
                    for m in order:
                        bar.set_postfix_str(f"{wl} {prompt.id} {m.name}", refresh=False)
                        if sample:
                            torch.manual_seed(seed + index)
                        inst = m.fresh() if fresh_per_prompt else m
                        res = call(inst, inputs, base_kw)
                        bar.update(1)
                        rec = recs.setdefault(m.name, {"workload": wl, "prompt_id": prompt.id, "method": m.name,
                                                       "prompt_tokens": prompt_len})
                        if res is None:
                            rec.update(status="unsupported", reason=unsupported.get(m.name))
                            continue
                        out, seconds, calls = res
                        if rnd and not torch.equal(out, outs[m.name]):
                            rec["repeats_identical"] = False  # same seed, same inputs: should not happen
                        outs.setdefault(m.name, out)
                        rec.setdefault("wall_s_runs", []).append(seconds)
                        if rnd:
                            continue  # counts and stats: the first round's (greedy repeats are identical)
                        n_new = out.shape[1] - prompt_len
                        stats = inst.decoder.stats if inst.decoder is not None else None
                        rec.update(
                            status="ok", new_tokens=n_new,
                            target_calls=calls, tokens_per_call=n_new / calls if calls else None,
                            reported_target_calls=stats.target_calls if stats is not None else None,
                            accepted_hist=(
                                {int(k): int(v) for k, v in sorted(stats.accepted_hist.items())}
                                if stats is not None else None
                            ),
                            decoder_stats=stats.as_dict() if stats is not None else None,
                        )
                for rec in recs.values():
                    if rec.get("status") == "ok":
                        rec["wall_s"] = statistics.median(rec["wall_s_runs"])
                        rec["tokens_per_s"] = rec["new_tokens"] / rec["wall_s"] if rec["wall_s"] > 0 else None
                plain_rec, plain_out = recs[BASELINE], outs.get(BASELINE)
                for m in method_objs:
                    rec = recs[m.name]
                    if rec["status"] != "ok":
                        continue
                    if plain_rec["status"] == "ok" and rec["tokens_per_s"] and plain_rec["tokens_per_s"]:
                        rec["speedup_vs_plain"] = rec["tokens_per_s"] / plain_rec["tokens_per_s"]
                    else:
                        rec["speedup_vs_plain"] = None
                    if sample or plain_out is None:
                        rec["identical_to_plain"] = None
                    else:
                        same = torch.equal(outs[m.name], plain_out)
                        rec["identical_to_plain"] = same
                        if not same:
                            rec["mismatch"] = _mismatch(model, plain_out, outs[m.name], prompt_len, tokenizer)
                    records.append(rec)
                for m in method_objs:
                    if recs[m.name]["status"] != "ok":
                        records.append(recs[m.name])
                index += 1
        bar.close()
    finally:
        counter.remove()

    settings = {
        "max_new_tokens": max_new_tokens,
        "sample": sample,
        "sampling": SAMPLING if sample else None,
        "seed": seed if sample else None,
        "warmup": f"each method once on the first prompt, {min(WARMUP_TOKENS, max_new_tokens)} tokens"
        if warmup else None,
        "order": "interleaved: all methods on a prompt back to back, the order rotated per prompt",
        "state": "a fresh instance of every method per prompt: nothing learnt carries over between prompts"
        if fresh_per_prompt else
        "one instance per method for the whole run: decoders carry what they learnt from prompt to prompt",
        "speedup": "per prompt: (method new tokens / s) / (plain new tokens / s), measured back to back",
        "repeats": repeats,
        "timing": (f"the median wall time of {repeats} runs per prompt and method, the methods' order rotated "
                   "each round") if repeats > 1 else "one run per prompt and method",
        "target_calls": "forward calls of the model, counted by a forward pre-hook (prefill included)",
        "prompts_per_workload": {wl: len(ps) for wl, ps in prompts.items()},
    }
    context["hardware"]["load_average_at_end"] = _loadavg()
    return {
        "context": {**context, "total_s": time.perf_counter() - t_start},
        "settings": settings,
        "methods": {m.name: {"description": m.description, "settings": m.settings} for m in method_objs},
        "unsupported": unsupported,
        "workloads": {wl: [p.id for p in ps] for wl, ps in prompts.items()},
        "records": records,
        "summary": summarise(records, list(prompts), names, sample),
        "mismatches": [
            {k: r[k] for k in ("workload", "prompt_id", "method", "mismatch")}
            for r in records if r.get("identical_to_plain") is False
        ],
    }
