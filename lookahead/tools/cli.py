"""Command line: python -m lookahead {demo,generate,bench,warmup,train-heads,build-corpus}

  demo      plain generate vs LookaheadDecoder on the bundled SmolLM2-135M: speed-up and identity
  generate  decode one prompt with LookaheadDecoder, streaming the text, then its statistics
  bench     side-by-side benchmark of decoding methods on task workloads; writes a JSON
            file with every figure, a Markdown table and a PNG plot
  warmup    compile the Numba kernels, keep the bundled model's converted weights and (--calibrate)
            its cost curve, so that no later run pays for them; the set-up script runs it
  train-heads
            train draft heads for a model (default: the bundled SmolLM2) on its own answers;
            LookaheadDecoder(heads=DraftHeads.load(DIR)) drafts with them
  build-corpus
            write a model's own answers as a draft corpus and install it for that model:
            LookaheadDecoder() drafts from it (or LookaheadDecoder(corpus=DraftCorpus.load(DIR/corpus)))

python -m lookahead COMMAND --help lists a command's options. Argument errors exit with status 2
and a message naming the valid choices, before any model is loaded. Each long phase of a command
is announced on stderr when it starts and timed when it ends.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys

QUICK_PROMPTS, QUICK_TOKENS = 2, 48
DEFAULT_PROMPTS, DEFAULT_TOKENS = 8, 256
DTYPES = ["float32", "bfloat16", "float16"]
THREADS_HELP = ("torch CPU threads, a number or auto; auto keeps torch's default unless other work keeps cores busy, "
                "then uses the cores left")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def thread_count(text: str) -> int | str:
    return "auto" if text.strip().lower() == "auto" else positive_int(text)


def name_list(kind: str, valid_names):
    """An argparse type: comma-separated names, each one of ``valid_names()`` (called when parsing, so that a
    registry of the bench is imported only when its option is given)."""

    def parse(text: str) -> list[str]:
        valid = list(valid_names())
        names = [n.strip() for n in text.split(",") if n.strip()]
        if not names:
            raise argparse.ArgumentTypeError(f"no {kind} given; valid: {', '.join(valid)}")
        unknown = [n for n in names if n not in valid]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {kind}{'s' if len(unknown) > 1 else ''} "
                                             f"{', '.join(map(repr, unknown))}; valid: {', '.join(valid)}")
        return names

    return parse


def _add(p: argparse.ArgumentParser, flag: str, help: str, **kw) -> None:
    """An option whose help ends with its default (a switch's: off) unless the help says it itself."""
    if "default: " not in help:
        help += " (default: off)" if kw.get("action") == "store_true" else " (default: %(default)s)"
    p.add_argument(flag, help=help, **kw)


def _common(p: argparse.ArgumentParser, threads) -> None:
    _add(p, "--model", "a local model folder or hub name (default: the bundled SmolLM2-135M-Instruct)")
    _add(p, "--device", "cpu, cuda, cuda:1, ...; auto: cuda if present, else cpu", default="auto")
    _add(p, "--dtype", "the model's weights and activations", choices=DTYPES, default="float32")
    _add(p, "--threads", THREADS_HELP + ("" if threads else " (default: torch's own choice, the conditions a "
                                         "benchmark reports; a hint is printed when the machine looks busy)"),
         type=thread_count, default=threads)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lookahead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="plain vs LookaheadDecoder on the bundled SmolLM2-135M: speed-up, identity")
    _add(demo, "--max-new-tokens", "new tokens per run", type=positive_int, default=160)
    _add(demo, "--prompt", "a user message (default: the built-in code-editing prompt)")
    _add(demo, "--heads", "also run lookahead+heads: the decoder with draft heads saved in DIR (bare --heads: the "
         "heads shipped for the bundled model; default: not run)", metavar="DIR", nargs="?", const="bundled")
    _add(demo, "--corpus", "also run lookahead+corpus: the decoder with the draft corpus saved in DIR (bare "
         "--corpus: the one shipped for the bundled model, which the default decoder already drafts from for it; "
         "default: not run)", metavar="DIR", nargs="?", const="bundled")
    _common(demo, "auto")

    gen = sub.add_parser("generate", help="decode one prompt with LookaheadDecoder, streaming the text",
                         description="Decode one prompt with LookaheadDecoder; the text streams to stdout, the "
                                     "decoder's statistics go to stderr.")
    gen.add_argument("--prompt", type=str, required=True, help="the user message (or raw text with --raw)")
    _add(gen, "--max-new-tokens", "the most new tokens to generate", type=positive_int, default=128)
    _add(gen, "--raw", "tokenize the prompt as is, without the chat template", action="store_true")
    _add(gen, "--config", "a LookaheadConfig setting, e.g. --config max_draft_tokens=16 or --config "
         "cost_curve=flat (repeatable; default: none, every setting at its default)", action="append",
         metavar="KEY=VALUE")
    _add(gen, "--sample", "sample (do_sample=True) instead of greedy decoding", action="store_true")
    _add(gen, "--temperature", "sampling temperature, used with --sample", type=float, default=0.7)
    _add(gen, "--top-p", "nucleus sampling: keep the most likely tokens up to this probability mass, used with "
         "--sample", type=float, default=0.9)
    _add(gen, "--plot-budget", "save a plot of the budget chosen at every step (and the cost curve) to this file "
         "(default: no plot)", metavar="PNG")
    _common(gen, "auto")

    bench = sub.add_parser("bench", help="benchmark decoding methods side by side; JSON, Markdown table, PNG plot",
                           description="Every method on the same prompt back to back (plain generate is always the "
                                       "baseline); speed-up per prompt = method tokens/s / plain tokens/s. Writes "
                                       "bench.json, bench.md and bench.png into --out.")
    _common(bench, None)
    _add(bench, "--workloads", "comma-separated workloads (default: all)",
         type=name_list("workload", lambda: importlib.import_module(".bench.workloads", __package__).WORKLOADS))
    _add(bench, "--methods", "comma-separated methods (default: plain, prompt-lookup, lookahead, lookahead-small); "
         "plain is always run",
         type=name_list("method", lambda: importlib.import_module(".bench.methods", __package__).METHODS))
    _add(bench, "--max-new-tokens", f"new tokens per prompt (default: {DEFAULT_TOKENS}; {QUICK_TOKENS} with --quick)",
         type=positive_int)
    _add(bench, "--prompts-per-workload", f"prompts per workload (default: {DEFAULT_PROMPTS}; {QUICK_PROMPTS} with "
         "--quick)", type=positive_int)
    _add(bench, "--quick", "a short run: few prompts, short outputs", action="store_true")
    _add(bench, "--sample", "sampled decoding (temperature 0.7, top_p 0.9) instead of greedy", action="store_true")
    _add(bench, "--seed", "seed of the sampled runs", type=int, default=0)
    _add(bench, "--out", "output folder", default="bench-out")
    _add(bench, "--reuse-decoders", "one decoder per method for the whole run, carrying what it learns from prompt "
         "to prompt (default: off, a fresh decoder per prompt)", action="store_true")
    _add(bench, "--repeats", "rounds of all methods per prompt; a method's time on a prompt is the median of its "
         "rounds", type=positive_int, default=1)
    _add(bench, "--no-progress", "no progress bar (default: off, one is shown)", action="store_true")

    warm = sub.add_parser(
        "warmup", help="compile the kernels and keep the bundled model's converted weights (and cost curve)",
        description="Everything a first run would otherwise pay for, done once: compiles every Numba kernel into "
                    "Numba's on-disk cache, keeps the bundled model's converted weights in the user's cache, and "
                    "with --calibrate measures and keeps its cost curve.")
    _add(warm, "--no-weights", "skip converting the bundled model's weights (default: off, they are converted and "
         "kept)", action="store_true")
    _add(warm, "--calibrate", "also measure and keep the bundled model's cost curve, for these comma-separated "
         "dtypes (float32 when none is named; default: not calibrated)", type=name_list("dtype", lambda: DTYPES),
         nargs="?", const=["float32"], metavar="DTYPES")
    _add(warm, "--threads", THREADS_HELP, type=thread_count, default="auto")
    try:  # train-heads and build-corpus, whose options lookahead.heads.train defines
        from ..heads import train
    except ImportError as err:  # a broken optional part leaves the other commands working
        for name in ("train-heads", "build-corpus"):
            sub.add_parser(name, help=f"(unavailable: {err})").set_defaults(unavailable=str(err))
        return parser
    train.add_arguments(sub.add_parser(
        "train-heads", help="train draft heads for a model on its own answers (self-distillation)",
        description=train.__doc__.replace("``", ""), formatter_class=argparse.RawDescriptionHelpFormatter))
    train.add_corpus_arguments(sub.add_parser(
        "build-corpus", help="write a model's own answers as a draft corpus (LookaheadDecoder(corpus=...))",
        description="The model answers prompts greedily (by default, questions it writes itself from the package's "
                    "topic list; every tenth topic held out); the training split's answers are saved as OUT/corpus "
                    "and installed for the model, where LookaheadDecoder() finds it. A rerun continues from "
                    "OUT/work."))
    return parser


def run_bench_command(args, argv: list[str]) -> int:
    import torch

    from .bench.methods import DEFAULT_METHODS
    from .bench.report import markdown, write_reports
    from .bench.runner import run_bench
    from .bench.workloads import WORKLOADS, build_workloads
    from .console import contention_hint, set_threads
    from .models import load_model

    workloads = build_workloads(args.workloads or list(WORKLOADS),
                                args.prompts_per_workload or (QUICK_PROMPTS if args.quick else DEFAULT_PROMPTS))
    threads = set_threads(args.threads)
    hint = contention_hint(threads) if args.threads is None else None
    if hint:
        print(hint, file=sys.stderr, flush=True)
    model, tok = load_model(args.model, dtype=getattr(torch, args.dtype), device=args.device, progress=True)
    result = run_bench(model, tok, workloads, args.methods or DEFAULT_METHODS,
                       max_new_tokens=args.max_new_tokens or (QUICK_TOKENS if args.quick else DEFAULT_TOKENS),
                       sample=args.sample, seed=args.seed, progress=not args.no_progress,
                       model_name=args.model or "SmolLM2-135M-Instruct (bundled, GGUF Q4_1 weights dequantised)",
                       command="python -m lookahead " + shlex.join(argv),
                       fresh_per_prompt=not args.reuse_decoders, repeats=args.repeats)
    paths = write_reports(result, args.out)
    print(markdown(result))
    print("wrote " + ", ".join(paths.values()), file=sys.stderr)
    if result["mismatches"]:
        print(f"warning: {len(result['mismatches'])} greedy output(s) differ from plain generate; see "
              f"{paths['markdown']}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the command of ``argv`` (default: ``sys.argv[1:]``), the library's log lines on stderr; the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    if getattr(args, "unavailable", None):
        print(f"error: {args.command} is unavailable: {args.unavailable}", file=sys.stderr)
        return 2
    from .console import logging_to_stderr, set_threads

    with logging_to_stderr():
        if args.command == "demo":
            from .demo import run_demo

            result = run_demo(args.max_new_tokens, args.prompt, args.model, dtype=args.dtype, device=args.device,
                              threads=args.threads, heads=args.heads, corpus=args.corpus)
            return 0 if all(v for k, v in result.items() if k.endswith("identical")) else 1
        if args.command == "generate":
            from .generate import run_generate

            return run_generate(args)
        if args.command == "bench":
            return run_bench_command(args, argv)
        if args.command == "warmup":
            from .warmup import run

            set_threads(args.threads)
            return run(weights=not args.no_weights, calibrate_dtypes=tuple(args.calibrate or ()))
        from ..heads import train

        return train.run_args(args) if args.command == "train-heads" else train.run_corpus_args(args)
