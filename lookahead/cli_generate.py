"""``python -m lookahead generate``: decode one prompt with LookaheadDecoder, streaming the text as it comes.

The streamer goes through ``generate``'s own ``streamer=`` argument (the decoder picks it up for
``custom_generate=decoder``). Should no token reach the streamer, the whole text is printed at the end.
The decoder's statistics follow on stderr, so stdout holds only the generated text.

Every second of the run is accounted for on stderr, each cost on its own line: the model's load, the
decoder's set-up (loading the n-gram trie's Numba kernels from Numba's on-disk cache; should a kernel not
be compiled yet, every kernel is compiled first, announced, as ``python -m lookahead warmup`` does), the
cost-curve calibration (timed forwards, once per model, device, dtype and thread count on a machine: kept
in the user's cache, so later runs read it back in milliseconds), the decoder's phases (propose, forward,
verify, bookkeeping) and what remains of ``generate``'s time outside them. The library's own log lines
(loading, calibrating) come first, as they happen. Example (SmolLM2 on a 2-core CPU, numbers illustrative)::

    loaded SmolLM2-135M-Instruct from its converted weights in 1.2 s (~/.cache/lookahead/models/...)
    [model loaded in 1.25 s]
    [decoder set-up in 0.35 s (Numba kernels loaded from their on-disk cache)]
    ...
    [cost-curve calibration 0.00 s (timed forwards once per model, device, dtype and thread count, ...)]
    [30 new tokens in 2.20 s: ...]
    [generate outside the decoder's phases and calibration: 0.40 s]
"""

from __future__ import annotations

import sys
import time


def parse_overrides(items: list[str]) -> dict:
    """``["tree_nodes=8", ...]`` -> ``{"tree_nodes": 8, ...}``, checked against LookaheadConfig's fields."""
    from dataclasses import fields

    from .config import LookaheadConfig

    known = {f.name: f for f in fields(LookaheadConfig)}
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ValueError(f"--config expects KEY=VALUE, got {item!r}")
        if key not in known:
            raise ValueError(f"unknown LookaheadConfig field {key!r}; valid: {', '.join(known)}")
        try:
            out[key] = int(value)
        except ValueError:
            try:
                out[key] = float(value)
            except ValueError:
                out[key] = {"true": True, "false": False}.get(value.lower(), value)
    LookaheadConfig(**out)  # validates the values, with the config's own messages
    return out


def _streamer_class():
    from transformers import TextStreamer

    class _Streamer(TextStreamer):
        """A TextStreamer that skips the prompt and remembers whether any new text arrived."""

        def __init__(self, tokenizer, file):
            super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True)
            self.file = file
            self.got_tokens = False

        def put(self, value):
            if not (self.skip_prompt and self.next_tokens_are_prompt):
                self.got_tokens = True
            super().put(value)

        def on_finalized_text(self, text: str, stream_end: bool = False):
            self.file.write(text + ("\n" if stream_end else ""))
            self.file.flush()

    return _Streamer


def run_generate(args, out=None, err=None) -> int:
    """Run the ``generate`` subcommand with parsed ``args``; returns the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    import torch

    from .config import LookaheadConfig
    from .decoder import LookaheadDecoder
    from .demo import chat_inputs
    from .models import load_model

    try:
        overrides = parse_overrides(args.config or [])
    except ValueError as e:
        print(f"error: {e}", file=err)
        return 2
    from .console import set_threads
    from .warmup import ensure_kernels

    dtype = getattr(torch, args.dtype)
    set_threads(getattr(args, "threads", "auto"))
    t0 = time.perf_counter()
    model, tok = load_model(args.model, dtype=dtype, device=None if args.device == "auto" else args.device,
                            progress=True)
    if args.device == "auto" and torch.cuda.is_available():
        model = model.to("cuda")
    print(f"[model loaded in {time.perf_counter() - t0:.2f} s]", file=err, flush=True)
    ensure_kernels()  # announced when it compiles: never silently inside generate
    if args.raw or not getattr(tok, "chat_template", None):
        enc = tok(args.prompt, return_tensors="pt")
        inputs = {k: v.to(model.device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}
    else:
        inputs = chat_inputs(tok, args.prompt, model.device)
    n_prompt = inputs["input_ids"].shape[1]
    t0 = time.perf_counter()
    decoder = LookaheadDecoder(LookaheadConfig(**overrides))  # builds a trie: the Numba kernels' first use
    print(f"[decoder set-up in {time.perf_counter() - t0:.2f} s (Numba kernels loaded from their on-disk "
          "cache)]", file=err, flush=True)
    kw = {"max_new_tokens": args.max_new_tokens, "do_sample": bool(args.sample)}
    if args.sample:
        kw.update(temperature=args.temperature, top_p=args.top_p)
    gc = model.generation_config
    if gc.pad_token_id is None and gc.eos_token_id is not None:
        eos = gc.eos_token_id
        kw["pad_token_id"] = eos[0] if isinstance(eos, (list, tuple)) else eos
    streamer = _streamer_class()(tok, out)
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            seq = model.generate(**inputs, **kw, custom_generate=decoder, streamer=streamer)
    except ValueError as e:
        print(f"\nerror: {e}", file=err)
        return 2
    seconds = time.perf_counter() - t0
    if not streamer.got_tokens:  # no streaming route in this version: print the whole text now
        out.write(tok.decode(seq[0, n_prompt:], skip_special_tokens=True) + "\n")
        out.flush()
        print("[note: the decoder streamed nothing, so the text was printed at the end]", file=err)
    s = decoder.stats
    print(f"\n[{s}]", file=err)
    calibration = getattr(s, "time_calibration", None)
    if calibration is not None:
        print(f"[cost-curve calibration {calibration:.2f} s (timed forwards once per model, device, dtype "
              "and thread count, then kept; part of generate)]", file=err)
    print(f"[{s.new_tokens} new tokens in {seconds:.2f} s: {s.new_tokens / seconds:.1f} tokens/s, "
          f"{s.target_calls / max(s.new_tokens, 1):.2f} target calls per token; {decoder.config}]", file=err)
    phases = sum(getattr(s, f"time_{p}", 0.0) for p in ("propose", "forward", "verify", "bookkeeping"))
    other = seconds - phases - (calibration or 0.0)
    print(f"[generate outside the decoder's phases and calibration: {other:.2f} s]", file=err)
    if getattr(args, "plot_budget", None):
        from .stats import plot_budgets

        print(f"[budget plot: {plot_budgets(s, args.plot_budget)}]", file=err)
    return 0
