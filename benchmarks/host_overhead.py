"""Host (Python) time per decoding step outside the model's forward, on a tiny model.

A 1-layer, 64-wide random Llama makes the forward cheap, so the decode loop's own work (draft
proposal, budget, tree packing, verification, stopping criteria, KV-cache and trie bookkeeping,
stats) is not hidden behind it. Per method::

    host overhead per step = (wall time of model.generate(...) - time inside the top-level forward) / steps

Time inside the forward comes from a forward pre-hook and a forward hook on the top-level model;
steps are the forward calls (``decoder.stats.target_calls`` for the decoder, the prefill included;
each run gets a new decoder, built before the timed call).
Methods: ``plain`` (``model.generate``), ``never`` (the decoder with a cost curve under which one
extra token costs 1000x, so the budget keeps plain steps), ``always`` (``adaptive=False``: the
full draft tree every step) and ``flat`` (the default decoder priced by a flat cost curve, as on a GPU: the
budget, the wide steps and the lookahead window all run, which is the step a GPU user's decode takes). The
prompt is 40 random ids repeated 4 times, so drafts exist; 300 new tokens (``min_new_tokens`` keeps EOS from stopping early; it brings two min-length logits
processors, which the decoder applies at each row on the accepted path; ``--no-eos`` sets
``eos_token_id=None`` instead: no processors, the max length alone stops). Each method is warmed up once
(Numba JIT, first-call costs), then timed ``--repeats`` times, round robin; the table gives the
median and min of the host overhead per step, the forward time per step, steps and tokens/call.

Run from the repository root::

    python -m benchmarks.host_overhead [--repeats 5] [--threads 1] [--no-eos] [--json out.json]
    python benchmarks/host_overhead.py --profile always   # cProfile of one method, forward excluded

Only the public API is used (``LookaheadDecoder``, ``generate(custom_generate=...)``; the fixed budget of
``always`` through ``_tuning``, or the 0.1 API's ``adaptive=False``), so the same script measures an older install
too: ``PYTHONPATH=/path/to/old/site-packages python benchmarks/host_overhead.py`` (``benchmarks/before_after.py``
runs both, interleaved).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import inspect
import json
import pstats
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lookahead import LookaheadDecoder

METHODS = ("plain", "never", "always", "flat")
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
"""``--clock``: wall time, or this thread's CPU time (with one torch thread the forward runs on it too), which a
busy machine inflates far less: time other processes take from the core is not counted."""
clock_now = time.perf_counter
NEVER_CURVE = ((1, 0.001), (2, 1.0), (256, 100.0))  # an extra token costs 1000x: always a plain step
FLAT_CURVE = ((1, 0.010), (2, 0.010), (256, 0.0102))  # 256 rows cost 1.02 one-row steps: a GPU's regime
# (benchmarks.replay.FLAT_CURVE's values, kept here: this script imports only lookahead's public API, so that it
# measures an older checkout too)
GOALS_MS = {"never": 0.1, "always": 0.25}  # what the host-overhead goal asked


def tiny_model() -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()  # float32
    model.generation_config.pad_token_id = 0
    return model


def prompt_ids(batch: int = 1) -> torch.Tensor:
    """long[batch, 160]: per row 40 random ids repeated 4 times (row 0 the same for every batch size)."""
    gen = torch.Generator().manual_seed(0)
    return torch.stack([torch.randint(3, 256, (40,), generator=gen).repeat(4) for _ in range(batch)])


def make_decoder(method: str, rows: int = 1) -> LookaheadDecoder | None:
    """A new decoder for ``method``, its state for ``rows`` rows made (as a server's, kept across calls)."""
    if method == "never":
        decoder = LookaheadDecoder(cost_curve=NEVER_CURVE)
    elif method == "always":
        if "_tuning" in inspect.signature(LookaheadDecoder.__init__).parameters:
            from lookahead._tuning import Tuning

            decoder = LookaheadDecoder(_tuning=Tuning(adaptive=False))
        else:  # the 0.1 API
            decoder = LookaheadDecoder(adaptive=False)
    elif method == "flat":
        decoder = LookaheadDecoder(cost_curve=FLAT_CURVE)
    else:
        return None
    if rows > 1:
        decoder.policies_for(rows)
    return decoder


class ForwardClock:
    """Forward hooks that time the top-level forward calls; ``paused`` is True inside one."""

    def __init__(self, model):
        self.seconds, self.calls, self.paused, self._t = 0.0, 0, False, 0.0
        self._handles = [model.register_forward_pre_hook(self._pre), model.register_forward_hook(self._post)]

    def _pre(self, module, args):
        self.paused, self._t = True, clock_now()

    def _post(self, module, args, output):
        self.seconds += clock_now() - self._t
        self.calls += 1
        self.paused = False

    def remove(self):
        for h in self._handles:
            h.remove()


def generate(model, ids, decoder: LookaheadDecoder | None, max_new_tokens: int) -> torch.Tensor:
    extra = {"custom_generate": decoder} if decoder is not None else {}
    return model.generate(ids, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False,
                          **extra)


def run_once(model, ids, method: str, max_new_tokens: int) -> dict:
    decoder = make_decoder(method, ids.shape[0])  # built outside the timed call, as a server would keep one
    gc.collect()
    clock = ForwardClock(model)
    try:
        t = clock_now()
        out = generate(model, ids, decoder, max_new_tokens)
        wall = clock_now() - t
    finally:
        clock.remove()
    steps = decoder.stats.target_calls if decoder is not None else clock.calls
    new = (out.shape[1] - ids.shape[1]) * out.shape[0]
    return {"wall_s": wall, "forward_s": clock.seconds, "steps": steps, "new_tokens": new,
            "host_ms_per_step": (wall - clock.seconds) / steps * 1e3,
            "forward_ms_per_step": clock.seconds / steps * 1e3, "tokens_per_call": new / steps,
            "sequence": out[:, ids.shape[1]:].tolist()}


def measure(model, ids, methods, repeats: int, max_new_tokens: int) -> dict:
    warm = {m: run_once(model, ids, m, max_new_tokens) for m in methods}
    ref = warm[methods[0]]["sequence"]
    for m in methods:
        if warm[m]["sequence"] != ref:
            print(f"WARNING: {m}'s output differs from {methods[0]}'s")
    runs = {m: [] for m in methods}
    for _ in range(repeats):
        for m in methods:
            r = run_once(model, ids, m, max_new_tokens)
            del r["sequence"]
            runs[m].append(r)
    summary = {}
    for m, rs in runs.items():
        host = [r["host_ms_per_step"] for r in rs]
        summary[m] = {"host_ms_median": statistics.median(host), "host_ms_min": min(host),
                      "forward_ms_median": statistics.median(r["forward_ms_per_step"] for r in rs),
                      "steps": rs[0]["steps"], "tokens_per_call": rs[0]["tokens_per_call"],
                      "goal_ms": GOALS_MS.get(m)}
    return {"summary": summary, "runs": runs}


def table(summary: dict) -> str:
    lines = ["| method | host ms/step (median) | min | forward ms/step | steps | tokens/call | goal ms |",
             "|---|---|---|---|---|---|---|"]
    for m, s in summary.items():
        goal = "-" if s["goal_ms"] is None else f"{s['goal_ms']:.2f}"
        lines.append(f"| {m} | {s['host_ms_median']:.3f} | {s['host_ms_min']:.3f} | {s['forward_ms_median']:.3f} "
                     f"| {s['steps']} | {s['tokens_per_call']:.2f} | {goal} |")
    return "\n".join(lines)


def profile(model, ids, method: str, repeats: int, max_new_tokens: int, top: int = 30) -> None:
    """cProfile ``repeats`` runs of ``method``; a clock that stops inside the forward excludes it."""
    run_once(model, ids, method, max_new_tokens)  # warm-up
    clock, frozen = ForwardClock(model), [0.0, 0.0]  # [seconds spent paused, perf_counter at pause]

    def timer() -> float:  # perf_counter minus the time spent inside forwards
        now = time.perf_counter()
        if clock.paused:
            if not frozen[1]:
                frozen[1] = now
            return frozen[1] - frozen[0]
        if frozen[1]:
            frozen[0] += now - frozen[1]
            frozen[1] = 0.0
        return now - frozen[0]

    prof = cProfile.Profile(timer)
    steps = 0
    try:
        for _ in range(repeats):
            decoder, calls = make_decoder(method, ids.shape[0]), clock.calls
            prof.enable()
            generate(model, ids, decoder, max_new_tokens)
            prof.disable()
            steps += clock.calls - calls
    finally:
        clock.remove()
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:top]
    print(f"\n{method}: {steps} steps over {repeats} runs; per step, forward excluded (cProfile inflates times)\n")
    print(f"{'calls/step':>10} {'tottime us':>10} {'cumtime us':>10}  function")
    for (file, line, name), (_, ncalls, tt, ct, _) in rows:
        where = name if file == "~" else f"{file.split('site-packages/')[-1]}:{line}({name})"
        print(f"{ncalls / steps:10.2f} {tt / steps * 1e6:10.1f} {ct / steps * 1e6:10.1f}  {where}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per method (default 5)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--max-new-tokens", type=int, default=300)
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ",".join(METHODS))
    ap.add_argument("--json", metavar="PATH", help="also write the runs and the summary as JSON")
    ap.add_argument("--no-eos", action="store_true",
                    help="eos_token_id=None: no logits processors (min_new_tokens then adds none), max length only")
    ap.add_argument("--profile", choices=METHODS, metavar="METHOD", help="cProfile one method instead")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="wall time, or the thread's CPU time (robust on a busy machine; needs --threads 1)")
    ap.add_argument("--batch", type=int, default=1,
                    help="rows per generate call (left-padding-free prompts of 160 tokens each; default 1): a "
                         "step's host work for the whole batch, to compare with --batch 1 (goal: 16 rows at most 3x)")
    args = ap.parse_args(argv)
    global clock_now
    clock_now = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    model, ids = tiny_model(), prompt_ids(args.batch)
    if args.no_eos:
        model.generation_config.eos_token_id = None
    if args.profile:
        profile(model, ids, args.profile, args.repeats, args.max_new_tokens)
        return
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if unknown := set(methods) - set(METHODS):
        ap.error(f"unknown methods {sorted(unknown)}; choose from {METHODS}")
    result = measure(model, ids, methods, args.repeats, args.max_new_tokens)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.clock} clock, {ids.shape[0]} row(s), "
          f"prompt {ids.shape[1]} tokens, "
          f"{args.max_new_tokens} new tokens, {args.repeats} repeats{', no EOS' if args.no_eos else ''}\n")
    print(table(result["summary"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "batch": args.batch, "max_new_tokens": args.max_new_tokens,
                       "repeats": args.repeats,
                       "no_eos": args.no_eos, **result}, f, indent=1)


if __name__ == "__main__":
    main()
