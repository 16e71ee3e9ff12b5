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
# (plain text above, no reST markup: the docstring is the description that --help prints)

from __future__ import annotations

import argparse
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
    """``--threads``: ``auto`` or a positive integer."""
    return "auto" if text.strip().lower() == "auto" else positive_int(text)


def name_list(kind: str, valid_names):
    """An argparse type: comma-separated names, each one of ``valid_names()`` (called when parsing)."""

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

    parse.__name__ = f"{kind} list"
    return parse


def _methods():
    from .bench.methods import METHODS

    return METHODS


def _workloads():
    from .bench.workloads import WORKLOADS

    return WORKLOADS


def _common(p: argparse.ArgumentParser, threads) -> None:
    p.add_argument("--model", type=str, default=None,
                   help="a local model folder or hub name (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--device", type=str, default="auto",
                   help="cpu, cuda, cuda:1, ...; auto: cuda if present, else cpu (default: %(default)s)")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="the model's weights and activations (default: %(default)s)")
    p.add_argument("--threads", type=thread_count, default=threads, help=THREADS_HELP + (
        " (default: %(default)s)" if threads else " (default: torch's own choice, the conditions a benchmark "
                                                  "reports; a hint is printed when the machine looks busy)"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lookahead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="plain vs LookaheadDecoder on the bundled SmolLM2-135M: speed-up, identity")
    demo.add_argument("--max-new-tokens", type=positive_int, default=160,
                      help="new tokens per run (default: %(default)s)")
    demo.add_argument("--prompt", type=str, default=None,
                      help="a user message (default: the built-in code-editing prompt)")
    demo.add_argument("--heads", metavar="DIR", nargs="?", const="bundled", default=None,
                      help="also run lookahead+heads: the decoder with draft heads saved in DIR (bare --heads: the "
                           "heads shipped for the bundled model; default: not run)")
    demo.add_argument("--corpus", metavar="DIR", nargs="?", const="bundled", default=None,
                      help="also run lookahead+corpus: the decoder with the draft corpus saved in DIR (bare "
                           "--corpus: the one shipped for the bundled model, which the default decoder already "
                           "drafts from for it; default: not run)")
    _common(demo, "auto")

    gen = sub.add_parser("generate", help="decode one prompt with LookaheadDecoder, streaming the text",
                         description="Decode one prompt with LookaheadDecoder; the text streams to stdout, the "
                                     "decoder's statistics go to stderr.")
    gen.add_argument("--prompt", type=str, required=True, help="the user message (or raw text with --raw)")
    gen.add_argument("--max-new-tokens", type=positive_int, default=128,
                     help="the most new tokens to generate (default: %(default)s)")
    gen.add_argument("--raw", action="store_true",
                     help="tokenize the prompt as is, without the chat template (default: off)")
    gen.add_argument("--config", action="append", metavar="KEY=VALUE",
                     help="a LookaheadConfig setting, e.g. --config max_draft_tokens=16 or --config cost_curve=flat "
                          "(repeatable; default: none, every setting at its default)")
    gen.add_argument("--sample", action="store_true",
                     help="sample (do_sample=True) instead of greedy decoding (default: off)")
    gen.add_argument("--temperature", type=float, default=0.7,
                     help="sampling temperature, used with --sample (default: %(default)s)")
    gen.add_argument("--top-p", type=float, default=0.9,
                     help="nucleus sampling: keep the most likely tokens up to this probability mass, used with "
                          "--sample (default: %(default)s)")
    gen.add_argument("--plot-budget", metavar="PNG", default=None,
                     help="save a plot of the budget chosen at every step (and the cost curve) to this file "
                          "(default: no plot)")
    _common(gen, "auto")

    bench = sub.add_parser("bench", help="benchmark decoding methods side by side; JSON, Markdown table, PNG plot",
                           description="Every method on the same prompt back to back (plain generate is always the "
                                       "baseline); speed-up per prompt = method tokens/s / plain tokens/s. Writes "
                                       "bench.json, bench.md and bench.png into --out.")
    _common(bench, None)
    bench.add_argument("--workloads", type=name_list("workload", _workloads), default=None,
                       help="comma-separated workloads (default: all)")
    bench.add_argument("--methods", type=name_list("method", _methods), default=None,
                       help="comma-separated methods (default: plain, prompt-lookup, lookahead, lookahead-small); "
                            "plain is always run")
    bench.add_argument("--max-new-tokens", type=positive_int, default=None,
                       help=f"new tokens per prompt (default: {DEFAULT_TOKENS}; {QUICK_TOKENS} with --quick)")
    bench.add_argument("--prompts-per-workload", type=positive_int, default=None,
                       help=f"prompts per workload (default: {DEFAULT_PROMPTS}; {QUICK_PROMPTS} with --quick)")
    bench.add_argument("--quick", action="store_true", help="a short run: few prompts, short outputs (default: off)")
    bench.add_argument("--sample", action="store_true",
                       help="sampled decoding (temperature 0.7, top_p 0.9) instead of greedy (default: off)")
    bench.add_argument("--seed", type=int, default=0, help="seed of the sampled runs (default: %(default)s)")
    bench.add_argument("--out", type=str, default="bench-out", help="output folder (default: %(default)s)")
    bench.add_argument("--reuse-decoders", action="store_true",
                       help="one decoder per method for the whole run, carrying what it learns from prompt to "
                            "prompt (default: off, a fresh decoder per prompt)")
    bench.add_argument("--repeats", type=positive_int, default=1,
                       help="rounds of all methods per prompt; a method's time on a prompt is the median of its "
                            "rounds (default: %(default)s)")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar (default: off, one is shown)")

    warm = sub.add_parser(
        "warmup", help="compile the kernels and keep the bundled model's converted weights (and cost curve)",
        description="Everything a first run would otherwise pay for, done once: compiles every Numba kernel of the "
                    "package (kept in Numba's on-disk cache), converts the bundled model's GGUF weights and keeps "
                    "them in the user's cache, and with --calibrate measures and keeps its cost curve. Each phase "
                    "prints a line when it starts and its time when it ends.")
    warm.add_argument("--no-weights", action="store_true",
                      help="skip converting the bundled model's weights (default: off, they are converted and kept)")
    warm.add_argument("--calibrate", type=name_list("dtype", lambda: DTYPES), nargs="?", const=["float32"],
                      default=None, metavar="DTYPES",
                      help="also measure and keep the bundled model's cost curve, for these comma-separated dtypes "
                           "(float32 when none is named; default: not calibrated)")
    warm.add_argument("--threads", type=thread_count, default="auto", help=THREADS_HELP + " (default: %(default)s)")
    _add_training(sub)
    return parser


def _add_training(sub) -> None:
    """``train-heads`` and ``build-corpus``, whose options ``lookahead.heads.train`` defines."""
    try:
        from ..heads import train
    except ImportError as err:  # a broken optional part leaves the other commands working
        for name in ("train-heads", "build-corpus"):
            sub.add_parser(name, help=f"(unavailable: {err})").set_defaults(unavailable=str(err))
        return
    train.add_arguments(sub.add_parser(
        "train-heads", help="train draft heads for a model on its own answers (self-distillation)",
        description=train.__doc__.replace("``", ""), formatter_class=argparse.RawDescriptionHelpFormatter))
    train.add_corpus_arguments(sub.add_parser(
        "build-corpus", help="write a model's own answers as a draft corpus (LookaheadDecoder(corpus=...))",
        description="The model answers prompts greedily (by default, questions it writes itself from the package's "
                    "topic list, and one direct request per topic; every tenth topic held out), and the answers of "
                    "the training split are saved as OUT/corpus and installed for the model, where "
                    "LookaheadDecoder() finds it. The output stays exactly that of plain decoding. Resumable: a "
                    "rerun continues from OUT/work."))


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
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the command, the library's log lines on stderr; returns
    the exit status."""
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
