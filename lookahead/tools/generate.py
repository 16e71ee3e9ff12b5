"""``python -m lookahead generate``: one prompt decoded, its text streamed to stdout (printed whole at the end
should none reach the streamer), then on stderr where every second went."""

from __future__ import annotations

import functools
import sys
import time


def parse_overrides(items: list[str]) -> dict:
    """``["max_draft_tokens=16", "cost_curve=flat"]`` -> ``{"max_draft_tokens": 16, "cost_curve": "flat"}``, checked
    against ``LookaheadConfig`` (ValueError)."""
    from dataclasses import fields

    from ..config import LookaheadConfig

    known = [f.name for f in fields(LookaheadConfig)]
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ValueError(f"--config expects KEY=VALUE, got {item!r}")
        if key not in known:
            raise ValueError(f"unknown LookaheadConfig field {key!r}; valid: {', '.join(known)}")
        out[key] = int(value) if value.strip().lstrip("-").isdigit() else value.strip()
    LookaheadConfig(**out)  # the config's own messages for a bad value
    return out


def run_generate(args) -> int:
    """The ``generate`` command on parsed ``args``; returns the exit status (2: a bad setting or request)."""
    say = functools.partial(print, file=sys.stderr, flush=True)
    try:
        overrides = parse_overrides(args.config or [])
    except ValueError as e:
        say(f"error: {e}")
        return 2
    import torch
    from transformers import TextStreamer

    from ..decoder import LookaheadDecoder
    from . import models
    from .bench.runner import encode, pad_kwargs
    from .bench.workloads import Prompt
    from .console import set_threads
    from .warmup import ensure_kernels

    set_threads(args.threads)
    t0 = time.perf_counter()
    model, tok = models.load_model(args.model, dtype=getattr(torch, args.dtype), device=args.device, progress=True)
    say(f"[model loaded in {time.perf_counter() - t0:.2f} s]")
    ensure_kernels()  # announced when it compiles: never silently inside generate
    inputs = encode(Prompt("prompt", args.prompt, chat=not args.raw), tok, model.device)  # raw without a template
    t0 = time.perf_counter()
    decoder = LookaheadDecoder(**overrides)  # builds a trie: the Numba kernels' first use
    say(f"[decoder set-up in {time.perf_counter() - t0:.2f} s (Numba kernels loaded from their on-disk cache)]")
    kw = {"max_new_tokens": args.max_new_tokens, "do_sample": args.sample, **pad_kwargs(model),
          **({"temperature": args.temperature, "top_p": args.top_p} if args.sample else {})}

    class Streamer(TextStreamer):  # to stdout, remembering whether any new text arrived
        got_tokens = False

        def put(self, value):
            self.got_tokens = self.got_tokens or not (self.skip_prompt and self.next_tokens_are_prompt)
            super().put(value)

    streamer = Streamer(tok, skip_prompt=True, skip_special_tokens=True)
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            seq = model.generate(**inputs, **kw, custom_generate=decoder, streamer=streamer)
    except ValueError as e:
        say(f"\nerror: {e}")
        return 2
    seconds = time.perf_counter() - t0
    if not streamer.got_tokens:
        print(tok.decode(seq[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True), flush=True)
        say("[note: the decoder streamed nothing, so the text was printed at the end]")
    s = decoder.stats
    phases = s.time_propose + s.time_forward + s.time_verify + s.time_bookkeeping
    say(f"\n[{s}]")
    say(f"[cost-curve calibration {s.time_calibration:.2f} s (timed steps once per model, device, dtype and thread "
        "count, then kept; part of generate)]")
    say(f"[{s.new_tokens} new tokens in {seconds:.2f} s: {s.new_tokens / seconds:.1f} tokens/s, "
        f"{s.target_calls / max(s.new_tokens, 1):.2f} target calls per token; {decoder.config}]")
    say(f"[generate outside the decoder's phases and calibration: {seconds - phases - s.time_calibration:.2f} s]")
    if args.plot_budget:
        from .plots import plot_budgets

        say(f"[budget plot: {plot_budgets(s, args.plot_budget)}]")
    return 0
