"""``python -m lookahead demo``: plain greedy vs LookaheadDecoder on the bundled SmolLM2-135M."""

from __future__ import annotations

import time

import torch

BUNDLED_MODEL = "SmolLM2-135M-Instruct"
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


def chat_inputs(tokenizer, text: str, device=None):
    """The tokenized chat-template prompt of one user message, as generate() kwargs."""
    enc = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    return {k: v.to(device) if device is not None else v for k, v in enc.items()}


def run_header(model_name: str | None, prompt: str | None, dtype, device, new_tokens: int) -> str:
    """The demo's summary line: the model that really ran (the ``--model`` argument, or the bundled one
    when it is None or "smollm2", as :func:`~lookahead.models.load_model` reads it) and whose prompt.

    >>> run_header(None, None, torch.float32, "cpu", 160)
    'model: SmolLM2-135M-Instruct (torch.float32, cpu), greedy, 160 new tokens, code-editing prompt'
    >>> run_header("./my-llama", "Hi!", torch.bfloat16, "cuda:0", 12)
    'model: ./my-llama (torch.bfloat16, cuda:0), greedy, 12 new tokens, your prompt'
    """
    name = BUNDLED_MODEL if model_name in (None, "smollm2") else model_name
    which = "code-editing prompt" if prompt is None else "your prompt"
    return f"model: {name} ({dtype}, {device}), greedy, {new_tokens} new tokens, {which}"


def run_demo(max_new_tokens: int = 160, prompt: str | None = None, model_name: str | None = None,
             dtype: str = "float32", device: str = "auto", threads: int | str | None = "auto",
             heads: str | None = None, corpus: str | None = None) -> dict:
    """Plain greedy ``generate`` against the decoder on one prompt, both timed after an untimed warm-up of
    each (which calibrates the cost curve once, if no kept one fits); prints the output, the speed of each
    and what the decoder did and why. Each phase is logged (``"lookahead"``, INFO) when it starts and ends.

    ``heads``: also time the decoder with draft heads (``"bundled"``: ``DraftHeads.bundled()``; else a folder
    for ``DraftHeads.load``), refused before any decoding if they were trained for another model.
    ``corpus``: also time the decoder with a draft corpus of the model's own writing (``"bundled"``:
    ``DraftCorpus.bundled()``; else a folder for ``DraftCorpus.load``), refused likewise."""
    from .console import phase, set_threads
    from .decoder import LookaheadDecoder
    from .models import load_model
    from .warmup import ensure_kernels

    set_threads(threads)
    model, tok = load_model(model_name, dtype=getattr(torch, dtype),
                            device=None if device == "auto" else device, progress=True)
    if device == "auto" and torch.cuda.is_available():
        model = model.to("cuda")
    ensure_kernels()
    inputs = chat_inputs(tok, DEMO_PROMPT if prompt is None else prompt, model.device)
    kw = dict(max_new_tokens=max_new_tokens, do_sample=False)
    decoder = LookaheadDecoder()
    extras = {}  # name -> (decoder, the origin its extra drafts carry)
    if heads is not None:
        from .heads import DraftHeads

        loaded = DraftHeads.bundled() if heads == "bundled" else DraftHeads.load(heads)
        loaded.check_model(model)  # a clear ValueError for another model's heads, before any decoding
        extras["heads"] = (LookaheadDecoder(heads=loaded), "heads")
    if corpus is not None:
        from .corpus import DraftCorpus

        written = DraftCorpus.bundled() if corpus == "bundled" else DraftCorpus.load(corpus)
        written.check_model(model)
        extras["corpus"] = (LookaheadDecoder(corpus=written), "corpus")
    with phase("warming up: 8 tokens plain and 8 with the decoder, not timed"):
        model.generate(**inputs, max_new_tokens=8, do_sample=False)
        model.generate(**inputs, max_new_tokens=8, custom_generate=decoder)
        for extra, _ in extras.values():
            model.generate(**inputs, max_new_tokens=8, custom_generate=extra)

    with phase(f"plain generate, up to {max_new_tokens} new tokens"):
        t = time.perf_counter()
        plain = model.generate(**inputs, **kw)
        t_plain = time.perf_counter() - t
    with phase(f"LookaheadDecoder, up to {max_new_tokens} new tokens"):
        t = time.perf_counter()
        ours = model.generate(**inputs, custom_generate=decoder, max_new_tokens=max_new_tokens)
        t_ours = time.perf_counter() - t
    timed = {}
    for name, (extra, _) in extras.items():
        with phase(f"LookaheadDecoder with the {name}, up to {max_new_tokens} new tokens"):
            t = time.perf_counter()
            out = model.generate(**inputs, custom_generate=extra, max_new_tokens=max_new_tokens)
            timed[name] = (out, time.perf_counter() - t)

    n_prompt = inputs["input_ids"].shape[1]
    n_plain, n_ours = plain.shape[1] - n_prompt, ours.shape[1] - n_prompt
    identical = torch.equal(plain, ours)
    s = decoder.stats
    print("\n--- output (LookaheadDecoder) ---")
    print(tok.decode(ours[0, n_prompt:], skip_special_tokens=True))
    print("--- end of output ---\n")
    print(run_header(model_name, prompt, model.dtype, model.device, n_ours))
    print(f"plain generate     : {n_plain / t_plain:7.1f} tokens/s  ({n_plain} target calls)")
    print(f"LookaheadDecoder   : {n_ours / t_ours:7.1f} tokens/s  ({s.target_calls} target calls, "
          f"{s.target_calls / max(n_ours, 1):.2f} calls/token, {s.tokens_per_call:.2f} tokens/call)")
    print(f"speed-up           : {t_plain / t_ours:.2f}x")
    print(f"identical output   : {'yes' if identical else 'NO'}")
    result = {"t_plain": t_plain, "t_ours": t_ours, "identical": identical, "stats": s.as_dict()}
    for name, (extra, origin) in extras.items():
        out, seconds = timed[name]
        h, n = extra.stats, out.shape[1] - n_prompt
        same = torch.equal(plain, out)
        result.update({f"t_{name}": seconds, f"{name}_identical": same, f"{name}_stats": h.as_dict()})
        label = f"lookahead+{name}"
        print(f"{label:<19}: {n / seconds:7.1f} tokens/s  ({h.target_calls} target calls, "
              f"{h.tokens_per_call:.2f} tokens/call, {h.accepted_by_origin.get(origin, 0)} tokens from the {name})")
        print(f"{'speed-up (' + name + ')':<19}: {t_plain / seconds:.2f}x")
        print(f"{'identical (' + name + ')':<19}: {'yes' if same else 'NO'}")
    print(s.explain())
    return result
