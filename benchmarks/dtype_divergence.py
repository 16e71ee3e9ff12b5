"""How often greedy outputs differ from plain greedy ``generate`` in bf16, fp16 and fp32, and why.

Two measurements on the bundled SmolLM2-135M-Instruct (CPU, one torch thread), from the repository root:

    python -m benchmarks.dtype_divergence run --dtype bf16 --per-workload 4 --max-new-tokens 128
    python -m benchmarks.dtype_divergence noise --dtype bf16 --positions 300
    python -m benchmarks.dtype_divergence report            # markdown tables of everything measured

``run``: per prompt, plain greedy ``generate`` (its own logits kept: ``output_logits=True``), then each
method (``--methods``): ``plain-again`` (plain a second time: must always be identical),
``prompt-lookup`` (transformers' ``prompt_lookup_num_tokens=10``), ``lookahead`` (``LookaheadDecoder()``,
the default budget), ``lookahead-fixed`` (``adaptive=False``: the full tree every step) and, with
``benchmarks/results/dtype/strict-mode.patch`` applied (an experimental ``LookaheadConfig(strict=True)``,
not in the package: see that folder's README), ``lookahead-strict`` / ``lookahead-fixed-strict``. Recorded
per method (and the index of the run, in the file's ``runs``, that measured it): identical to plain or not; at the first difference, the top-2 logit margin of plain's own
one-token forward there (the logits plain chose from) and the gap between plain's and the method's
token in those logits; new tokens, target calls (a forward pre-hook), seconds. ``--reuse-plain`` takes
plain's tokens and logit margins from an earlier run's file instead of decoding plain again (plain
greedy on the CPU is deterministic: ``plain-again`` checks it).

``noise``: the rounding noise itself. On plain's own outputs (from the ``run`` file), at each studied
position ``i`` (new token ``i`` >= 1), with plain's KV cache (built exactly as plain builds it: prompt
prefill, then one token per forward):

- ``root-k8`` / ``root-k16``: row 0 of a forward of k rows (the pending token plus plain's next k-1
  tokens as a linear draft, packed as the decoder packs a step: 4D mask, explicit positions) against
  the one-row forward of the same token over the same cache (what plain computes);
- ``rows-k16``: every row of that 16-row forward against plain's logits at its position (the rows after
  the first also see in-step keys/values computed in the multi-row forward);
- ``chunk16-rows``: plain's continuation fed in 16-row steps (the decoder when every draft is
  accepted), every row against plain's logits at its position: cache drift plus kernel noise;
- ``chunk16-onerow``: a ONE-row forward at each position over that 16-row-built cache, against
  plain's: what a re-decided position (strict mode) still differs by, since the keys/values of the
  tokens before it were computed in multi-row forwards.

``prefill``: the decoder's first step, the prompt plus a 16-token draft (plain's own next tokens) in one
forward, against plain's prefill of the prompt alone: are the prompt's keys/values bitwise equal, and the
root row's logits and the next one-row forward's over each cache.

Per comparison: |diff| of the top logit (plain's argmax token), |diff| of the top-2 margin (each
row's own top two), the largest change of ``logit[a] - logit[x]`` over plain's top-8 tokens ``x``
("pair": a flip needs at least the margin of this), whether the argmax flipped, and whether the
row is bitwise equal. Results go to ``benchmarks/results/dtype/{divergence,noise}-<dtype>.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import time

import numpy as np
import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
WORKLOADS = ["code-editing", "code-completion", "chat"]
DEFAULT_METHODS = ["plain-again", "prompt-lookup", "lookahead", "lookahead-fixed"]
OUT = os.path.join("benchmarks", "results", "dtype")
NOISE_KINDS = ["root-k8", "root-k16", "rows-k16", "chunk16-rows", "chunk16-onerow"]


def method_kwargs(name: str) -> dict:
    """generate() kwargs of a method (a fresh decoder each call)."""
    from lookahead import LookaheadDecoder

    if name == "plain-again":
        return {}
    if name == "prompt-lookup":
        return {"prompt_lookup_num_tokens": 10}
    decoders = {
        "lookahead": lambda: LookaheadDecoder(),
        "lookahead-fixed": lambda: LookaheadDecoder(adaptive=False),
        "lookahead-strict": lambda: LookaheadDecoder(strict=True),
        "lookahead-fixed-strict": lambda: LookaheadDecoder(adaptive=False, strict=True),
    }
    if name not in decoders:
        raise ValueError(f"unknown method {name!r}")
    try:
        return {"custom_generate": decoders[name]()}
    except TypeError as err:  # LookaheadConfig has no `strict` field
        raise SystemExit(f"{name} needs benchmarks/results/dtype/strict-mode.patch applied ({err})") from None


def _path(out: str, kind: str, dtype: str) -> str:
    return os.path.join(out, f"{kind}-{dtype}.json")


def _load(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _save(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, separators=(",", ":"))
    os.replace(tmp, path)


def _context(dtype: str) -> dict:
    import subprocess

    import transformers

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True, timeout=10).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, []
    return {"model": "SmolLM2-135M-Instruct (bundled GGUF, de-quantised)", "dtype": dtype, "device": "cpu",
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "git": commit, "modified": [d[3:] for d in dirty if d.strip()],
            "command": " ".join(sys.argv), "load_average": list(os.getloadavg())}


def _margin(logits: torch.Tensor) -> float:
    top = logits.float().topk(2).values
    return float(top[0] - top[1])


def _prompts(per_workload: int):
    from lookahead.bench.workloads import build_workloads

    return [(wl, p) for wl, ps in build_workloads(WORKLOADS, per_workload).items() for p in ps]


def cmd_run(args) -> None:
    from lookahead import LookaheadDecoder
    from lookahead.bench.runner import CallCounter, _generate_kwargs, encode
    from lookahead.models import load_smollm2

    model, tok = load_smollm2(dtype=DTYPES[args.dtype])
    path = _path(args.out, "divergence", args.dtype)
    old = _load(path) if (args.reuse_plain or args.merge) else None
    data = old if old is not None else {"prompts": {}}
    run_index = len(data.get("runs", []))
    data.setdefault("runs", []).append({**_context(args.dtype), "per_workload": args.per_workload,
                                        "max_new_tokens": args.max_new_tokens, "methods": args.methods})
    kw = _generate_kwargs(model, args.max_new_tokens, False)
    counter = CallCounter(model)
    t = time.perf_counter()
    LookaheadDecoder().cost_curve(model)  # the default budget's calibration, once, outside the timings
    print(f"calibration {time.perf_counter() - t:.1f} s", file=sys.stderr)

    def gen(inputs, **extra):
        counter.count = 0
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**inputs, **kw, **extra)
        return out, time.perf_counter() - t0, counter.count

    suffix = ""
    if args.strict_margin is not None:  # strict mode's threshold for this dtype, for this run only
        from lookahead import verify

        verify.STRICT_MARGINS[DTYPES[args.dtype]] = args.strict_margin
        suffix = f"@{args.strict_margin:g}"
    for wl, prompt in _prompts(args.per_workload):
        inputs = encode(prompt, tok, model.device)
        ids = inputs["input_ids"][0].tolist()
        L = len(ids)
        rec = data["prompts"].get(prompt.id)
        if args.reuse_plain:
            if rec is None or rec["prompt_ids"] != ids or rec["max_new_tokens"] != args.max_new_tokens:
                raise SystemExit(f"--reuse-plain: no matching plain run of {prompt.id} in {path}")
        else:
            out, secs, calls = gen(inputs, return_dict_in_generate=True, output_logits=True)
            logits = torch.cat(out.logits).float()  # [T, V], what plain chose each token from
            top = logits.topk(2)
            new = {"workload": wl, "prompt_ids": ids, "max_new_tokens": args.max_new_tokens,
                   "plain": {"tokens": out.sequences[0, L:].tolist(), "seconds": secs, "calls": calls,
                             "run": run_index,
                             "margins": [round(float(m), 6) for m in top.values[:, 0] - top.values[:, 1]],
                             "top2_tokens": top.indices.tolist()},
                   "methods": {}}
            if rec is not None and rec["plain"]["tokens"] == new["plain"]["tokens"]:
                new["methods"] = rec["methods"]  # the same plain output: earlier methods' verdicts hold
            rec = data["prompts"][prompt.id] = new
        plain = rec["plain"]["tokens"]
        for name in args.methods:
            out, secs, calls = gen(inputs, **method_kwargs(name))
            got = out[0, L:].tolist()
            r = {"identical": got == plain, "new_tokens": len(got), "calls": calls, "seconds": round(secs, 3),
                 "tokens_per_call": round(len(got) / calls, 3), "run": run_index}
            if got != plain:
                k = next((i for i in range(min(len(got), len(plain))) if got[i] != plain[i]),
                         min(len(got), len(plain)))
                r["first_difference"] = k
                if k < min(len(got), len(plain)):
                    top2 = rec["plain"]["top2_tokens"][k]
                    r.update(plain_margin=rec["plain"]["margins"][k], plain_token=plain[k], method_token=got[k],
                             method_token_is_plain_second=got[k] == top2[1],
                             text_plain=tok.decode(plain[max(0, k - 6): k + 6]),
                             text_method=tok.decode(got[max(0, k - 6): k + 6]))
            name = name + suffix if "strict" in name else name
            rec["methods"][name] = r
            print(f"{args.dtype} {prompt.id:28s} {name:24s} identical={r['identical']!s:5s} "
                  f"diff@{r.get('first_difference', '-')} margin={r.get('plain_margin', '-')} "
                  f"{len(got)} tok {calls} calls {secs:.1f}s", file=sys.stderr, flush=True)
        _save(path, data)
    counter.remove()


# ---------------------------------------------------------------------------------------------- noise


def _compare(y: torch.Tensor, r: torch.Tensor) -> dict[str, np.ndarray]:
    """Row by row, test logits ``y`` against reference ``r`` (float[R, V] each)."""
    y, r = y.float(), r.float()
    rt, yt = r.topk(8), y.topk(2)
    a = rt.indices[:, 0]
    rows = torch.arange(len(r))
    d_top = (y[rows, a] - r[rows, a]).abs()
    r_margin = rt.values[:, 0] - rt.values[:, 1]
    d_margin = ((yt.values[:, 0] - yt.values[:, 1]) - r_margin).abs()
    ry = y.gather(1, rt.indices)  # y at plain's top-8 tokens
    d_pair = ((ry[:, :1] - ry[:, 1:]) - (rt.values[:, :1] - rt.values[:, 1:])).abs().amax(1)
    return {"d_top": d_top.numpy(), "d_margin": d_margin.numpy(), "d_pair": d_pair.numpy(),
            "flip": (y.argmax(-1) != r.argmax(-1)).numpy(), "equal": (y == r).all(-1).numpy(),
            "ref_margin": r_margin.numpy()}


def _crop_to(cache, n: int) -> None:
    """Keep the first ``n`` entries (this transformers crops by a negative count only)."""
    extra = cache.get_seq_length() - n
    if extra > 0:
        cache.crop(-extra)


def cmd_noise(args) -> None:
    from transformers import DynamicCache

    from lookahead import compat
    from lookahead.models import load_smollm2
    from lookahead.tree import pack_step

    runs = _load(_path(args.out, "divergence", args.dtype))
    if runs is None:
        raise SystemExit("run `run` for this dtype first: the noise is measured on plain's outputs")
    model, _ = load_smollm2(dtype=DTYPES[args.dtype])
    ckw = compat.cache_kwarg_name(model)
    K = 16

    def fwd(cache, tokens: list[int], start: int, rows: int, packed: bool = True):
        """Logits float[rows, V] of a forward of ``tokens`` at positions ``start``..: one pending token plus a
        linear draft, packed as the decoder packs it (4D mask) when ``packed``, else causal (mask None)."""
        if packed and len(tokens) > 1:
            ids, pos, mask = pack_step(np.asarray(tokens[:1]), np.asarray([start]), np.asarray(tokens[1:]),
                                       np.arange(-1, len(tokens) - 2), None, start, model.dtype)
        else:
            ids = torch.tensor([tokens])
            pos, mask = torch.arange(start, start + len(tokens))[None], None
        out = model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=True, logits_to_keep=rows,
                    **{ckw: cache})
        return out.logits[0, -rows:].float()

    acc: dict[str, list[dict]] = {k: [] for k in NOISE_KINDS}
    sanity = {"positions": 0, "bitwise_equal_to_generate": 0}
    used = []
    # round-robin over the workloads, so that every workload contributes positions
    by_wl: dict[str, list] = {}
    for pid, rec in runs["prompts"].items():
        by_wl.setdefault(rec["workload"], []).append((pid, rec))
    order = [x for group in zip(*by_wl.values()) for x in group]
    total = 0
    t_start = time.perf_counter()
    with torch.inference_mode():
        for pid, rec in order:
            if total >= args.positions:
                break
            prompt, cont = rec["prompt_ids"], rec["plain"]["tokens"]
            L, T = len(prompt), len(cont)
            n_pos = min(T - K, args.positions - total, args.per_prompt)  # new tokens 1..n_pos
            if n_pos < K:
                continue
            seq = prompt + cont
            # plain's reference: prefill, then one token per forward; logits of new token i in ref[i]
            cache = DynamicCache(config=model.config)
            ref = [fwd(cache, prompt, 0, 1, packed=False)[0]]
            root8, root16 = [], []
            for i in range(1, n_pos + 1):
                P = L + i - 1  # input position of the token whose row predicts new token i
                for k, sink in ((8, root8), (K, root16)):
                    rows = fwd(cache, seq[P:P + k], P, k)
                    _crop_to(cache, P)
                    sink.append(rows)
                ref.append(fwd(cache, seq[P:P + 1], P, 1, packed=False)[0])
            # rows of the 16-row forward at position i predict new tokens i..i+15: need ref up to n_pos+15
            for i in range(n_pos + 1, n_pos + K):
                P = L + i - 1
                ref.append(fwd(cache, seq[P:P + 1], P, 1, packed=False)[0])
            ref_t = torch.stack(ref)  # [n_pos + 16, V]
            # sanity: does this reproduce generate's own logits (margins) bitwise?
            gm = np.asarray(rec["plain"]["margins"][: len(ref)])
            mm = np.round((ref_t.topk(2).values[:, 0] - ref_t.topk(2).values[:, 1]).numpy(), 6)
            sanity["positions"] += len(gm)
            sanity["bitwise_equal_to_generate"] += int((np.abs(gm - mm) < 1e-6).sum())
            one = torch.stack([r[0] for r in root16])
            acc["root-k8"].append(_compare(torch.stack([r[0] for r in root8]), ref_t[1 : n_pos + 1]))
            acc["root-k16"].append(_compare(one, ref_t[1 : n_pos + 1]))
            acc["rows-k16"].append(_compare(torch.cat(root16), torch.cat([ref_t[i : i + K]
                                                                          for i in range(1, n_pos + 1)])))
            # the decoder when every draft is accepted: 16-row steps; and one-row forwards over that cache
            cache = DynamicCache(config=model.config)
            fwd(cache, prompt, 0, 1, packed=False)
            chunk_rows, onerow = [], []
            for i0 in range(1, n_pos + 1, K):
                P0 = L + i0 - 1
                k = min(K, n_pos + 1 - i0)
                chunk_rows.append(fwd(cache, seq[P0:P0 + k], P0, k))
                for j in range(k):
                    c = copy.deepcopy(cache)
                    _crop_to(c, P0 + j)
                    onerow.append(fwd(c, seq[P0 + j:P0 + j + 1], P0 + j, 1, packed=False)[0])
            acc["chunk16-rows"].append(_compare(torch.cat(chunk_rows), ref_t[1 : n_pos + 1]))
            acc["chunk16-onerow"].append(_compare(torch.stack(onerow), ref_t[1 : n_pos + 1]))
            total += n_pos
            used.append({"prompt": pid, "positions": n_pos})
            print(f"{args.dtype} noise {pid}: {n_pos} positions ({total} in all), "
                  f"{time.perf_counter() - t_start:.0f} s", file=sys.stderr, flush=True)
    result = {"context": {**_context(args.dtype), "positions": total, "prompts": used, "sanity": sanity},
              "kinds": {}}
    for kind, parts in acc.items():
        if not parts:
            continue
        result["kinds"][kind] = _summary({k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
    _save(_path(args.out, "noise", args.dtype), result)


def cmd_prefill(args) -> None:
    """The decoder's first step: the prompt plus a draft in one forward, against plain's prefill alone.

    Per prompt: are the prompt's KV entries bitwise those of plain's prefill; the root row's logits
    (predicting new token 0) against plain's; and the next one-row forward (new token 1) over each cache.
    """
    from transformers import DynamicCache

    from lookahead import compat
    from lookahead.models import load_smollm2
    from lookahead.tree import pack_step

    runs = _load(_path(args.out, "divergence", args.dtype))
    if runs is None:
        raise SystemExit("run `run` for this dtype first")
    model, _ = load_smollm2(dtype=DTYPES[args.dtype])
    ckw = compat.cache_kwarg_name(model)
    rows_out, root, nxt_plain, nxt_draft = [], [], [], []
    with torch.inference_mode():
        for pid, rec in runs["prompts"].items():
            prompt, cont = rec["prompt_ids"], rec["plain"]["tokens"]
            L, k = len(prompt), min(args.rows, len(cont))
            caches, logits = [], []
            for draft in ([], cont[:k]):
                cache = DynamicCache(config=model.config)
                ids, pos, mask = pack_step(np.asarray(prompt), np.arange(L), np.asarray(draft, dtype=np.int64),
                                           np.arange(-1, len(draft) - 1), None, 0, model.dtype)
                if not draft:  # plain's prefill: the model's own causal mask
                    mask = None
                out = model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=True,
                            logits_to_keep=len(draft) + 1, **{ckw: cache})
                logits.append(out.logits[0, -len(draft) - 1].float())
                _crop_to(cache, L)
                caches.append(cache)
            dk = max(float((a.keys.float() - b.keys.float()).abs().max()) for a, b in
                     zip(caches[0].layers, caches[1].layers))
            root.append(torch.stack(logits))
            nx = [model(input_ids=torch.tensor([[cont[0]]]), position_ids=torch.tensor([[L]]), use_cache=True,
                        logits_to_keep=1, **{ckw: c}).logits[0, -1].float() for c in caches]
            nxt_plain.append(nx[0])
            nxt_draft.append(nx[1])
            rows_out.append({"prompt": pid, "prompt_len": L, "draft_rows": k, "kv_bitwise_equal": dk == 0.0,
                             "kv_max_abs_diff": dk})
            print(f"{args.dtype} prefill {pid}: kv diff {dk:.3g}", file=sys.stderr, flush=True)
    result = {"context": {**_context(args.dtype), "rows": args.rows}, "prompts": rows_out, "kinds": {}}
    pairs = {"prefill-root": (torch.stack([r[1] for r in root]), torch.stack([r[0] for r in root])),
             "prefill-next-onerow": (torch.stack(nxt_draft), torch.stack(nxt_plain))}
    for kind, (y, r) in pairs.items():
        result["kinds"][kind] = _summary(_compare(y, r))
    _save(_path(args.out, "prefill", args.dtype), result)


def _summary(cat: dict[str, np.ndarray]) -> dict:
    stats = {"rows": int(len(cat["flip"])), "bitwise_equal": int(cat["equal"].sum()), "flips": int(cat["flip"].sum()),
             "flip_ref_margins": [round(float(m), 6) for m in cat["ref_margin"][cat["flip"]]]}
    for key in ("d_top", "d_margin", "d_pair"):
        stats[key] = {"max": float(cat[key].max()), "p999": float(np.quantile(cat[key], 0.999)),
                      "p99": float(np.quantile(cat[key], 0.99)), "median": float(np.median(cat[key]))}
    return stats


# --------------------------------------------------------------------------------------------- report


def _fmt(x: float) -> str:
    return f"{x:.3g}" if x else "0"


def cmd_report(args) -> None:
    lines = []
    methods_seen: list[str] = []
    tables = {}
    for dt in DTYPES:
        data = _load(_path(args.out, "divergence", dt))
        if data is None:
            continue
        tables[dt] = data
        for rec in data["prompts"].values():
            for m in rec["methods"]:
                if m not in methods_seen:
                    methods_seen.append(m)
    if tables:
        lines.append("| dtype | prompts | new tokens (max) | " + " | ".join(methods_seen) + " |")
        lines.append("|---|---|---|" + "---|" * len(methods_seen))
        for dt, data in tables.items():
            recs = list(data["prompts"].values())
            cells = []
            for m in methods_seen:
                rs = [r["methods"][m] for r in recs if m in r["methods"]]
                cells.append(f"{sum(r['identical'] for r in rs)}/{len(rs)}" if rs else "-")
            mx = sorted({r["max_new_tokens"] for r in recs})
            lines.append(f"| {dt} | {len(recs)} | {','.join(map(str, mx))} | " + " | ".join(cells) + " |")
        lines += ["", "Per token: a method's output follows plain's until its first difference, so the tokens it "
                  "matched before diverging (or all plain's tokens when identical) are its exposure, and "
                  "differences / exposure is its rate per 1000 tokens:", "",
                  "| dtype | method | differences | tokens matched | per 1000 tokens |", "|---|---|---|---|---|"]
        for dt, data in tables.items():
            for m in methods_seen:
                rs = [(r["methods"][m], len(r["plain"]["tokens"])) for r in data["prompts"].values()
                      if m in r["methods"]]
                if not rs:
                    continue
                diffs = sum(not a["identical"] for a, _ in rs)
                matched = sum(n if a["identical"] else a["first_difference"] + 1 for a, n in rs)
                lines.append(f"| {dt} | {m} | {diffs} | {matched} | {1000 * diffs / matched:.1f} |")
        lines += ["", "First differences (plain's top-2 margin at the position; `2nd`: the method took plain's "
                  "second choice):", "", "| dtype | prompt | method | at token | plain margin | 2nd | plain / method "
                  "text |", "|---|---|---|---|---|---|---|"]
        for dt, data in tables.items():
            for pid, rec in data["prompts"].items():
                for m, r in rec["methods"].items():
                    if not r["identical"]:
                        txt = (f"`{r.get('text_plain', '')!r}` / `{r.get('text_method', '')!r}`"
                               .replace("|", "\\|"))
                        lines.append(f"| {dt} | {pid} | {m} | {r.get('first_difference')} | "
                                     f"{_fmt(r.get('plain_margin', float('nan')))} | "
                                     f"{'yes' if r.get('method_token_is_plain_second') else 'no'} | {txt} |")
        lines += ["", "Plain's own top-2 margins over all positions (how often a near tie occurs):", "",
                  "| dtype | positions | margin = 0 | < 0.01 | < 0.05 | < 0.1 | < 0.25 | < 0.5 |",
                  "|---|---|---|---|---|---|---|---|"]
        for dt, data in tables.items():
            ms = np.concatenate([np.asarray(r["plain"]["margins"]) for r in data["prompts"].values()])
            cells = [f"{int((ms == 0).sum())}"] + [f"{int((ms < t).sum())}" for t in (0.01, 0.05, 0.1, 0.25, 0.5)]
            lines.append(f"| {dt} | {len(ms)} | " + " | ".join(cells) + " |")
        lines += ["", "Speed (sums over prompts): tokens per target call; tokens per second against plain's, "
                  "and a strict method's against its non-strict twin, only where both ran in the same run "
                  "(`-` otherwise: the machine's load differs between runs):", "",
                  "| dtype | method | run | tokens/call | tokens/s vs plain | tokens/s vs non-strict |",
                  "|---|---|---|---|---|---|"]

        def rate(rs):
            return sum(a["new_tokens"] for a in rs) / sum(a["seconds"] for a in rs)

        for dt, data in tables.items():
            recs = list(data["prompts"].values())
            for m in methods_seen:
                rs = [r["methods"][m] for r in recs if m in r["methods"]]
                if not rs:
                    continue
                run = rs[0].get("run")
                plain = [r["plain"] for r in recs if m in r["methods"]]
                vs_plain = (f"{rate(rs) / rate([{**p, 'new_tokens': len(p['tokens'])} for p in plain]):.2f}"
                            if all(p.get("run") == run for p in plain) else "-")
                twin = m.split("@")[0].replace("-strict", "")
                tw = [r["methods"].get(twin) for r in recs if m in r["methods"]]
                vs_twin = (f"{rate(rs) / rate(tw):.2f}" if "strict" in m and all(t and t.get("run") == run for t in tw)
                           else "-")
                toks, calls = sum(a["new_tokens"] for a in rs), sum(a["calls"] for a in rs)
                lines.append(f"| {dt} | {m} | {run} | {toks / calls:.2f} | {vs_plain} | {vs_twin} |")
    noise = {dt: _load(_path(args.out, "noise", dt)) for dt in DTYPES}
    noise = {dt: n for dt, n in noise.items() if n is not None}
    if noise:
        lines += ["", "Rounding noise (|diff| against plain's one-row forward; max / 99.9th percentile):", "",
                  "| dtype | comparison | rows | bitwise equal | top logit | top-2 margin | pair (top-8) | flips "
                  "(plain margins) |", "|---|---|---|---|---|---|---|---|"]
        for dt, n in noise.items():
            for kind, s in n["kinds"].items():
                flips = ", ".join(_fmt(m) for m in s["flip_ref_margins"][:6])
                lines.append(
                    f"| {dt} | {kind} | {s['rows']} | {s['bitwise_equal']} | {_fmt(s['d_top']['max'])} / "
                    f"{_fmt(s['d_top']['p999'])} | {_fmt(s['d_margin']['max'])} / {_fmt(s['d_margin']['p999'])} | "
                    f"{_fmt(s['d_pair']['max'])} / {_fmt(s['d_pair']['p999'])} | {s['flips']}"
                    + (f" ({flips})" if flips else "") + " |")
    pre = {dt: _load(_path(args.out, "prefill", dt)) for dt in DTYPES}
    pre = {dt: n for dt, n in pre.items() if n is not None}
    if pre:
        lines += ["", "The first step (prompt + a 16-token draft in one forward) against plain's prefill alone:", "",
                  "| dtype | prompts | prompt KV bitwise equal | KV max abs diff | root row: pair max, flips | "
                  "next one-row: pair max, flips |", "|---|---|---|---|---|---|"]
        for dt, n in pre.items():
            ps, k = n["prompts"], n["kinds"]
            lines.append(f"| {dt} | {len(ps)} | {sum(p['kv_bitwise_equal'] for p in ps)} | "
                         f"{_fmt(max(p['kv_max_abs_diff'] for p in ps))} | {_fmt(k['prefill-root']['d_pair']['max'])}, "
                         f"{k['prefill-root']['flips']} | {_fmt(k['prefill-next-onerow']['d_pair']['max'])}, "
                         f"{k['prefill-next-onerow']['flips']} |")
    print("\n".join(lines))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="plain vs the methods, per prompt")
    run.add_argument("--dtype", choices=list(DTYPES), required=True)
    run.add_argument("--per-workload", type=int, default=4, help="prompts per workload (default %(default)s)")
    run.add_argument("--max-new-tokens", type=int, default=128, help="(default %(default)s)")
    run.add_argument("--methods", type=lambda s: s.split(","), default=DEFAULT_METHODS,
                     help="comma-separated (default %(default)s)")
    run.add_argument("--reuse-plain", action="store_true",
                     help="take plain's outputs from the existing file (and add/replace these methods' verdicts)")
    run.add_argument("--merge", action="store_true", help="keep other prompts/methods of the existing file")
    run.add_argument("--strict-margin", type=float, default=None,
                     help="strict mode's top-2 margin for this dtype instead of verify.STRICT_MARGINS' (the strict "
                          "methods' names get '@<margin>')")
    noise = sub.add_parser("noise", help="multi-row vs one-row logits on plain's outputs")
    noise.add_argument("--dtype", choices=list(DTYPES), required=True)
    noise.add_argument("--positions", type=int, default=300, help="positions in all (default %(default)s)")
    noise.add_argument("--per-prompt", type=int, default=100, help="at most per prompt (default %(default)s)")
    prefill = sub.add_parser("prefill", help="the first step (prompt + draft) against plain's prefill")
    prefill.add_argument("--dtype", choices=list(DTYPES), required=True)
    prefill.add_argument("--rows", type=int, default=16, help="draft rows after the prompt (default %(default)s)")
    sub.add_parser("report", help="markdown tables of the files in --out")
    for p in (run, noise, prefill, sub.choices["report"]):
        p.add_argument("--out", default=OUT, help="(default %(default)s)")
        p.add_argument("--threads", type=int, default=1, help="torch threads (default %(default)s)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    {"run": cmd_run, "noise": cmd_noise, "prefill": cmd_prefill, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    main()
