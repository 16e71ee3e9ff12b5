"""``python -m lookahead demo``: plain greedy ``generate`` against the decoder on one prompt, both timed."""

from __future__ import annotations

import importlib
import time

import torch

DEMO_PROMPT = (
    "Here is a Python class. Add a docstring to every method and return the whole class.\n\n"
    "```python\n"
    "class Inventory:\n"
    "    def __init__(self):\n"
    "        self.items = {}\n\n"
    "    def add(self, name, count):\n"
    "        self.items[name] = self.items.get(name, 0) + count\n\n"
    "    def remove(self, name, count):\n"
    "        if self.items.get(name, 0) < count:\n"
    "            raise ValueError(name)\n"
    "        self.items[name] -= count\n\n"
    "    def total(self):\n"
    "        return sum(self.items.values())\n"
    "```"
)


def chat_inputs(tokenizer, chat, device=None) -> dict:
    """``generate`` kwargs of a chat-template prompt: one user message, or ``[(role, content), ...]`` (or dicts)
    ending with a user turn."""
    if isinstance(chat, str):
        chat = [("user", chat)]
    messages = [m if isinstance(m, dict) else {"role": m[0], "content": m[1]} for m in chat]
    enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    return {k: v.to(device) if device is not None else v for k, v in enc.items()}


def run_demo(max_new_tokens: int = 160, prompt: str | None = None, model_name: str | None = None,
             dtype: str = "float32", device: str = "auto", threads: int | str | None = "auto",
             heads: str | None = None, corpus: str | None = None) -> dict:
    """Prints the output, each one's speed, whether the texts are identical and what the decoder did and why; returns
    those figures (``t_plain``, ``t_ours``, ``identical``, ``stats``; ``t_heads``, ``heads_identical``, ... per
    extra). ``heads`` / ``corpus``: also the decoder with draft heads / a corpus (``"bundled"``, else a folder)."""
    from ..decoder import LookaheadDecoder
    from . import models
    from .console import phase, set_threads
    from .warmup import ensure_kernels

    set_threads(threads)
    model, tok = models.load_model(model_name, dtype=getattr(torch, dtype), device=device, progress=True)
    ensure_kernels()
    inputs = chat_inputs(tok, DEMO_PROMPT if prompt is None else prompt, model.device)
    decoders = {"": LookaheadDecoder()}  # "" the default; else the extra's name, which is also its drafts' origin
    for name, folder, class_name in (("heads", heads, "DraftHeads"), ("corpus", corpus, "DraftCorpus")):
        if folder is not None:
            kind = getattr(importlib.import_module(f"..{name}", __package__), class_name)
            made = kind.bundled() if folder == "bundled" else kind.load(folder)
            made.check_model(model)  # a clear ValueError for another model's, before any decoding
            decoders[name] = LookaheadDecoder(**{name: made})
    firsts = {}  # the process's first call of each, reported apart: it may pay one-time costs
    with phase("first calls: 8 tokens plain and 8 with the decoder, reported apart"):
        for name, kw in [("plain generate", {"do_sample": False})] + [
                (f"LookaheadDecoder{f' ({n})' if n else ''}", {"custom_generate": d}) for n, d in decoders.items()]:
            t = time.perf_counter()
            model.generate(**inputs, max_new_tokens=8, **kw)
            reason = getattr(kw.get("custom_generate"), "stats", None)
            firsts[name] = (time.perf_counter() - t, getattr(reason, "plain_reason", None))

    def timed(what: str, **kw):
        with phase(f"{what}, up to {max_new_tokens} new tokens") as t:
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, **kw)
        return out, t.seconds

    plain, t_plain = timed("plain generate", do_sample=False)
    runs = {name: timed(f"LookaheadDecoder{f' with the {name}' if name else ''}", custom_generate=d)
            for name, d in decoders.items()}
    n_prompt = inputs["input_ids"].shape[1]
    n_plain, n_ours = plain.shape[1] - n_prompt, runs[""][0].shape[1] - n_prompt
    print("\n--- output (LookaheadDecoder) ---")
    print(tok.decode(runs[""][0][0, n_prompt:], skip_special_tokens=True))
    print("--- end of output ---\n")
    name = models.BUNDLED_NAME if model_name in (None, "smollm2") else model_name
    print(f"model: {name} ({model.dtype}, {model.device}), greedy, {n_ours} new tokens, "
          f"{'code-editing prompt' if prompt is None else 'your prompt'}")
    print(f"plain generate     : {n_plain / t_plain:7.1f} tokens/s  ({n_plain} target calls)")
    result = {"t_plain": t_plain}
    for name, (out, seconds) in runs.items():
        d, n, same = decoders[name].stats, out.shape[1] - n_prompt, torch.equal(plain, out)
        label, key = (f"lookahead+{name}", f"{name}_") if name else ("LookaheadDecoder", "")
        result.update({f"t_{name or 'ours'}": seconds, f"{key}identical": same, f"{key}stats": d.as_dict()})
        extra = (f"{d.accepted_by_origin.get(name, 0)} tokens from the {name}" if name else
                 f"{d.target_calls / max(n, 1):.2f} calls/token")
        measured = f"; {d.time_calibration:.1f} s of it measuring the cost curve" if d.time_calibration >= 0.05 else ""
        print(f"{label:<19}: {n / seconds:7.1f} tokens/s  ({d.target_calls} target calls, {extra}, "
              f"{d.tokens_per_call:.2f} tokens/call{measured})")
        print(f"{f'speed-up ({name})' if name else 'speed-up':<19}: {t_plain / seconds:.2f}x")
        print(f"{f'identical ({name})' if name else 'identical output':<19}: {'yes' if same else 'NO'}")
    print(decoders[""].stats.explain())
    print("first call of the process (8 tokens, not in the figures above): " + "; ".join(
        f"{name} {seconds:.2f} s" + (f" (decoded plain: {why})" if why else "") for name, (seconds, why) in firsts.items()))
    return result
