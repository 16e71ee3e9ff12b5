"""The side-by-side runner: every method on the same prompt back to back, the order rotated from prompt to prompt
and round to round. ``run_bench`` returns one JSON-safe dict: ``records`` (per prompt and method: wall time, new
tokens, target calls counted by a forward pre-hook on the model's decoder, the decoder's statistics,
``speedup_vs_plain``, and greedy whether the output is plain ``generate``'s, else ``mismatch``), ``summary`` (per
workload, ``"all"`` and method), ``first_calls`` (each method's first call, plain first, in no median; None without
a warm-up), ``context`` (model, hardware, versions, command) and ``settings``.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
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


def as_prompts(workload: str, items: Sequence) -> list[Prompt]:
    """Prompts from ``Prompt`` objects, chat strings or token-id sequences (lists, tensors), named by position."""
    return [item if isinstance(item, Prompt) else Prompt(f"{workload}-{i}", item) if isinstance(item, str) else
            Prompt(f"{workload}-{i}", ids=tuple(map(int, item.tolist() if torch.is_tensor(item) else item)))
            for i, item in enumerate(items)]


def encode(prompt: Prompt, tokenizer, device) -> dict:
    """``generate`` inputs of one prompt."""
    if prompt.ids is not None:
        ids = torch.tensor([list(prompt.ids)], dtype=torch.long, device=device)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if tokenizer is None:
        raise ValueError(f"prompt {prompt.id!r} is text but no tokenizer was given")
    text = prompt.text
    if prompt.chat and getattr(tokenizer, "chat_template", None):
        from ..demo import chat_inputs

        return chat_inputs(tokenizer, text, device)
    if not isinstance(text, str):  # a chat for a tokenizer without a template
        text = "\n".join(f"{role}: {content}" for role, content in text) + "\nassistant:"
    enc = tokenizer(text, return_tensors="pt")
    return {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}


def pad_kwargs(model) -> dict:
    """``{"pad_token_id": EOS}`` where the generation config has no padding token (generate warns), else ``{}``."""
    eos = model.generation_config.eos_token_id
    if model.generation_config.pad_token_id is not None or eos is None:
        return {}
    return {"pad_token_id": eos[0] if isinstance(eos, (list, tuple)) else eos}


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _git_state() -> dict | None:
    """The commit of the lookahead checkout and its uncommitted files, when run from a git checkout."""
    root = os.path.dirname(os.path.abspath(__file__))
    try:
        run = [subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=10, check=True).stdout
               for cmd in (["git", "rev-parse", "HEAD"], ["git", "status", "--porcelain", "--untracked-files=no"])]
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": run[0].strip(), "modified": [line[3:] for line in run[1].split("\n") if line.strip()]}


def run_context(model, model_name: str | None, sample: bool, command: str | None = None) -> dict:
    import numpy
    import transformers

    import lookahead
    from lookahead.cost import cpu_model

    device = model.device
    return {
        "model": {"name": model_name or getattr(model.config, "name_or_path", None) or type(model).__name__,
                  "class": type(model).__name__, "model_type": getattr(model.config, "model_type", None),
                  "parameters": sum(p.numel() for p in model.parameters()),
                  "dtype": str(model.dtype).replace("torch.", ""), "device": str(device)},
        "hardware": {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                     "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                     "load_average_at_start": _loadavg()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "numpy": numpy.__version__,
                     "lookahead": lookahead.__version__, "platform": platform.platform(), "git": _git_state()},
        "mode": "sampled" if sample else "greedy",
        "exact": ("exact in distribution by construction (not checkable prompt by prompt)" if sample else
                  "exact: every output is compared token by token with plain generate"),
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command or " ".join(sys.argv),
    }


def _mismatch(model, plain_seq, other_seq, prompt_len: int, tokenizer) -> dict:
    """Where a greedy output first differs from plain's, and plain's top-2 logit gap there."""
    a, b = plain_seq[0].tolist(), other_seq[0].tolist()
    k = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
    info = {"first_difference": k - prompt_len, "plain_length": len(a) - prompt_len,
            "method_length": len(b) - prompt_len}
    if k < min(len(a), len(b)):
        with torch.no_grad():
            logits = model(input_ids=plain_seq[:, :k]).logits[0, -1].float()
        top2 = torch.topk(logits, 2).values
        info.update(plain_token=a[k], method_token=b[k], top2_gap=float(top2[0] - top2[1]),
                    method_token_gap=float(logits.max() - logits[b[k]]))
        if tokenizer is not None:
            info["plain_text_near"] = tokenizer.decode(a[max(prompt_len, k - 8): k + 8])
            info["method_text_near"] = tokenizer.decode(b[max(prompt_len, k - 8): k + 8])
    return info


def summarise(records: list[dict], workloads: list[str], methods: list[str], sample: bool) -> list[dict]:
    """Per workload (and over all of them, ``"all"``) and method: the speed-up's median and spread, and totals."""
    rows = []
    for wl in [*workloads, "all"]:
        for m in methods:
            recs = [r for r in records if r["method"] == m and wl in ("all", r["workload"])]
            ok = [r for r in recs if r["status"] == "ok"]
            row = {"workload": wl, "method": m, "prompts": len(ok),
                   "status": "ok" if ok else "unsupported" if recs else "no prompts"}
            rows.append(row)
            if not ok:
                continue
            ratios = [r["speedup_vs_plain"] for r in ok if r["speedup_vs_plain"] is not None]
            tokens, calls = sum(r["new_tokens"] for r in ok), sum(r["target_calls"] for r in ok)
            wall = sum(r["wall_s"] for r in ok)
            hist = sum((Counter(r.get("accepted_hist") or {}) for r in ok), Counter())
            quartiles = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
            row.update(
                speedup_median=statistics.median(ratios) if ratios else None,
                speedup_min=min(ratios, default=None), speedup_max=max(ratios, default=None),
                speedup_q1=quartiles[0] if ratios else None, speedup_q3=quartiles[2] if ratios else None,
                new_tokens=tokens, target_calls=calls, tokens_per_call=tokens / calls if calls else None,
                calls_per_token=calls / tokens if tokens else None, tokens_per_s=tokens / wall if wall else None,
                ms_per_call=1000 * wall / calls if calls else None, wall_s=wall,
                identical=None if sample else sum(bool(r["identical_to_plain"]) for r in ok),
                accepted_hist={k: hist[k] for k in sorted(hist)} or None,
            )
    return rows


def run_bench(model, tokenizer, workloads: dict[str, Sequence],
              methods: Sequence[str] | Sequence[Method] = ("plain", "prompt-lookup", "lookahead"),
              max_new_tokens: int = 128, sample: bool = False, seed: int = 0, warmup: bool = True,
              progress: bool = True, model_name: str | None = None, command: str | None = None,
              fresh_per_prompt: bool = True, repeats: int = 1) -> dict:
    """Every method on every prompt, back to back. ``workloads``: name -> prompts (:func:`as_prompts`); ``methods``:
    names in ``METHODS`` or ``Method`` objects, ``plain`` among them; ``fresh_per_prompt``: a new instance of each
    method per prompt (else one for the whole run). A method refusing sampled decoding (a ValueError) is recorded as
    unsupported; greedy, it raises."""
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if methods and all(isinstance(m, Method) for m in methods):
        if not any(m.name == BASELINE for m in methods):
            raise ValueError(f"the methods must include the {BASELINE!r} baseline")
        method_objs = sorted(methods, key=lambda m: m.name != BASELINE)
    else:
        method_objs = make_methods(list(methods))
    prompts = {wl: ps for wl, items in workloads.items() if (ps := as_prompts(wl, items))}
    if not prompts:
        raise ValueError("no prompts to run")
    device = model.device
    base_kw = {"max_new_tokens": max_new_tokens, "do_sample": sample, **(SAMPLING if sample else {}),
               **pad_kwargs(model)}
    context = run_context(model, model_name, sample, command)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    unsupported: dict[str, str] = {}
    calls = [0]
    # on the decoder: a step that also reads the hidden states (draft heads) calls it without the model's forward
    counted = getattr(model, "get_decoder", lambda: model)() or model
    hook = counted.register_forward_pre_hook(lambda module, args: calls.__setitem__(0, calls[0] + 1))
    t_start, warm = time.perf_counter(), min(WARMUP_TOKENS, max_new_tokens)

    def call(method: Method, inputs: dict, kw: dict, seed_at: int) -> dict | None:
        """One ``generate``'s figures, output and statistics, or None where the method refuses this mode."""
        if method.name in unsupported:
            return None
        if sample:
            torch.manual_seed(seed_at)
        method = method.fresh() if fresh_per_prompt else method
        calls[0] = 0
        sync()
        t0 = time.perf_counter()
        try:
            with torch.inference_mode():
                out = model.generate(**inputs, **kw, **method.kwargs())
        except ValueError as err:
            if not sample:
                raise
            unsupported[method.name] = f"{type(err).__name__}: {err}"
            return None
        sync()
        seconds, n_calls, n_new = time.perf_counter() - t0, calls[0], out.shape[1] - inputs["input_ids"].shape[1]
        return {"seconds": seconds, "new_tokens": n_new, "target_calls": n_calls, "out": out,
                "tokens_per_call": n_new / n_calls if n_calls else None, "stats": getattr(method.decoder, "stats", None)}

    def run_prompt(wl: str, prompt: Prompt, index: int) -> list[dict]:
        """Every method on one prompt, ``repeats`` rounds: one record per method, the supported ones first."""
        inputs = encode(prompt, tokenizer, device)
        n_prompt = inputs["input_ids"].shape[1]
        outs, recs = {}, {m.name: {"workload": wl, "prompt_id": prompt.id, "method": m.name,
                                   "prompt_tokens": n_prompt} for m in method_objs}
        for rnd in range(repeats):
            shift = (index + rnd) % len(method_objs)
            for m in method_objs[shift:] + method_objs[:shift]:
                bar.set_postfix_str(f"{wl} {prompt.id} {m.name}", refresh=False)
                rec, res = recs[m.name], call(m, inputs, base_kw, seed + index)
                bar.update(1)
                if res is None:
                    rec.update(status="unsupported", reason=unsupported.get(m.name))
                    continue
                out, stats = res.pop("out"), res.pop("stats")
                if rnd and not torch.equal(out, outs[m.name]):
                    rec["repeats_identical"] = False  # same seed, same inputs: should not happen
                outs.setdefault(m.name, out)
                rec.setdefault("wall_s_runs", []).append(res.pop("seconds"))
                if not rnd:  # counts and statistics: the first round's
                    rec.update(status="ok", **res, reported_target_calls=stats.target_calls if stats else None,
                               accepted_hist={int(k): int(v) for k, v in sorted(stats.accepted_hist.items())}
                               if stats else None, decoder_stats=stats.as_dict() if stats else None)
        done = [rec for rec in recs.values() if rec["status"] == "ok"]
        plain, plain_out = recs[BASELINE], outs.get(BASELINE)
        for rec in done:  # plain first: the baseline leads method_objs
            rec["wall_s"] = statistics.median(rec["wall_s_runs"])
            rec["tokens_per_s"] = rec["new_tokens"] / rec["wall_s"] if rec["wall_s"] > 0 else None
            rec["speedup_vs_plain"] = (rec["tokens_per_s"] / plain["tokens_per_s"] if rec["tokens_per_s"]
                                       and plain.get("tokens_per_s") else None)
            same = None if sample or plain_out is None else torch.equal(outs[rec["method"]], plain_out)
            rec["identical_to_plain"] = same
            if same is False:
                rec["mismatch"] = _mismatch(model, plain_out, outs[rec["method"]], n_prompt, tokenizer)
        return done + [rec for rec in recs.values() if rec["status"] != "ok"]

    def first_calls() -> dict:
        """Every method once, ``warm`` tokens on the first prompt, plain first: the run's first call of each."""
        wl, first = next((wl, ps[0]) for wl, ps in prompts.items())
        inputs, plain_s = encode(first, tokenizer, device), None
        firsts = {"prompt": f"{wl}/{first.id}", "max_new_tokens": warm, "order": [m.name for m in method_objs],
                  "methods": {}}
        for m in method_objs:  # the baseline leads method_objs
            res = call(m, inputs, {**base_kw, "max_new_tokens": warm}, seed)
            if res is None:
                firsts["methods"][m.name] = {"status": "unsupported", "reason": unsupported.get(m.name)}
                continue
            res.pop("out")
            stats, plain_s = res.pop("stats"), res["seconds"] if m.name == BASELINE else plain_s
            firsts["methods"][m.name] = {"status": "ok", **res, "seconds_vs_plain": res["seconds"] / plain_s,
                                         "decoded_plain": stats.plain_reason if stats else None}
        return firsts

    from tqdm.auto import tqdm

    records: list[dict] = []
    try:
        firsts = first_calls() if warmup else None
        bar = tqdm(total=sum(map(len, prompts.values())) * len(method_objs) * repeats, desc="bench", unit="run",
                   disable=not progress, file=sys.stderr)
        for index, (wl, prompt) in enumerate((wl, p) for wl, ps in prompts.items() for p in ps):
            records += run_prompt(wl, prompt, index)
        bar.close()
    finally:
        hook.remove()

    context["hardware"]["load_average_at_end"] = _loadavg()
    context["total_s"] = time.perf_counter() - t_start
    settings = {
        "max_new_tokens": max_new_tokens, "sample": sample, "sampling": SAMPLING if sample else None,
        "seed": seed if sample else None,
        "warmup": f"each method once on the first prompt, {warm} tokens, plain first, timed apart (first_calls)"
        if warmup else None,
        "order": "interleaved: all methods on a prompt back to back, the order rotated per prompt",
        "state": "a fresh instance of every method per prompt: nothing learnt carries over between prompts"
        if fresh_per_prompt else
        "one instance per method for the whole run: decoders carry what they learnt from prompt to prompt",
        "speedup": "per prompt: (method new tokens / s) / (plain new tokens / s), measured back to back",
        "repeats": repeats,
        "timing": f"the median wall time of {repeats} runs per prompt and method, the methods' order rotated each "
                  "round" if repeats > 1 else "one run per prompt and method",
        "target_calls": "forward calls of the model's decoder, counted by a forward pre-hook (prefill included)",
        "prompts_per_workload": {wl: len(ps) for wl, ps in prompts.items()},
    }
    return {
        "context": context, "settings": settings,
        "methods": {m.name: {"description": m.description, "settings": m.settings} for m in method_objs},
        "unsupported": unsupported,
        "workloads": {wl: [p.id for p in ps] for wl, ps in prompts.items()},
        "records": records,
        "summary": summarise(records, list(prompts), [m.name for m in method_objs], sample),
        "first_calls": firsts,
        "mismatches": [{k: r[k] for k in ("workload", "prompt_id", "method", "mismatch")}
                       for r in records if r.get("identical_to_plain") is False],
    }
