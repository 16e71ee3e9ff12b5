"""Command line: python -m lookahead {demo,generate,bench,warmup,train-heads,build-corpus}

  demo      plain generate vs LookaheadDecoder on the bundled SmolLM2-135M: speed-up and identity
  generate  decode one prompt with LookaheadDecoder, streaming the text, then its statistics
  bench     side-by-side benchmark of decoding methods on code and chat workloads; writes a JSON
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
and a message naming the valid choices; they are checked before any model is loaded. What each
command is doing goes to stderr as it happens: one line when a long phase starts, its time when it
ends.
"""
# (plain text above, no reST markup: the docstring is the description that --help prints)

from __future__ import annotations

import argparse
import sys

QUICK_PROMPTS = 2
QUICK_TOKENS = 48
DEFAULT_PROMPTS = 8
DEFAULT_TOKENS = 256


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


thread_count.__name__ = "thread count"


def _name_list(kind: str, registry_of):
    """An argparse type: comma-separated names, each checked against ``registry_of()``."""

    def parse(text: str) -> list[str]:
        valid = list(registry_of())
        names = [n.strip() for n in text.split(",") if n.strip()]
        if not names:
            raise argparse.ArgumentTypeError(f"no {kind} given; valid: {', '.join(valid)}")
        unknown = [n for n in names if n not in valid]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {kind}{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                f"valid: {', '.join(valid)}"
            )
        return names

    parse.__name__ = f"{kind} list"
    return parse


def _methods():
    from lookahead.bench.methods import METHODS

    return METHODS


def _workloads():
    from lookahead.bench.workloads import WORKLOADS

    return WORKLOADS


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=str, default=None,
                   help="a local model folder or hub name (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--device", type=str, default="auto",
                   help="cpu, cuda, cuda:1, ...; auto: cuda if present, else cpu (default: %(default)s)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="the model's weights and activations (default: %(default)s)")


THREADS_HELP = ("torch CPU threads, a number or auto; auto keeps torch's default unless other work keeps "
                "cores busy, then uses the cores left (on a 2-core machine with one core busy, 1 thread runs "
                "5-20x faster than 2)")


def _add_threads_arg(p: argparse.ArgumentParser, default) -> None:
    if default is None:
        p.add_argument("--threads", type=thread_count, default=None,
                       help=f"{THREADS_HELP} (default: torch's own choice, the conditions a benchmark "
                            "reports; a hint is printed when the machine looks busy)")
    else:
        p.add_argument("--threads", type=thread_count, default=default,
                       help=f"{THREADS_HELP} (default: %(default)s)")


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
                      help="also run lookahead+heads: the decoder with draft heads saved in DIR (bare --heads: "
                           "the heads shipped for the bundled model; default: not run)")
    demo.add_argument("--corpus", metavar="DIR", nargs="?", const="bundled", default=None,
                      help="also run lookahead+corpus: the decoder with the draft corpus saved in DIR (bare "
                           "--corpus: the corpus shipped for the bundled model, which the default decoder already "
                           "drafts from for it; default: not run)")
    _add_model_args(demo)
    _add_threads_arg(demo, "auto")

    gen = sub.add_parser("generate", help="decode one prompt with LookaheadDecoder, streaming the text",
                         description="Decode one prompt with LookaheadDecoder; the text streams to stdout, "
                                     "the decoder's statistics go to stderr.")
    gen.add_argument("--prompt", type=str, required=True, help="the user message (or raw text with --raw)")
    gen.add_argument("--max-new-tokens", type=positive_int, default=128,
                     help="the most new tokens to generate (default: %(default)s)")
    gen.add_argument("--raw", action="store_true",
                     help="tokenize the prompt as is, without the chat template (default: off)")
    gen.add_argument("--config", action="append", metavar="KEY=VALUE",
                     help="a LookaheadConfig field, e.g. --config tree_nodes=8 (repeatable; default: none, "
                          "every field at LookaheadConfig's default)")
    gen.add_argument("--sample", action="store_true",
                     help="sample (do_sample=True) instead of greedy decoding (default: off)")
    gen.add_argument("--temperature", type=float, default=0.7,
                     help="sampling temperature, used with --sample (default: %(default)s)")
    gen.add_argument("--top-p", type=float, default=0.9,
                     help="nucleus sampling: keep the most likely tokens up to this probability mass, used "
                          "with --sample (default: %(default)s)")
    gen.add_argument("--plot-budget", metavar="PNG", default=None,
                     help="save a plot of the budget chosen at every step (and the cost curve) to this file "
                          "(default: no plot)")
    _add_model_args(gen)
    _add_threads_arg(gen, "auto")

    bench = sub.add_parser(
        "bench", help="benchmark decoding methods side by side; JSON, Markdown table, PNG plot",
        description="Every method on the same prompt back to back (plain generate is always the baseline); "
                    "speed-up per prompt = method tokens/s / plain tokens/s. Writes bench.json, bench.md and "
                    "bench.png into --out.",
    )
    _add_model_args(bench)
    bench.add_argument("--workloads", type=_name_list("workload", _workloads), default=None,
                       help="comma-separated workloads (default: all: code-completion, code-editing, chat, "
                            "rewrite)")
    bench.add_argument("--methods", type=_name_list("method", _methods), default=None,
                       help="comma-separated methods (default: plain, prompt-lookup, lookahead, "
                            "lookahead-small; also plain-again, lookahead-window, lookahead-fixed); plain is "
                            "always run")
    bench.add_argument("--max-new-tokens", type=positive_int, default=None,
                       help=f"new tokens per prompt (default: {DEFAULT_TOKENS}; {QUICK_TOKENS} with --quick)")
    bench.add_argument("--prompts-per-workload", type=positive_int, default=None,
                       help=f"prompts per workload (default: {DEFAULT_PROMPTS}; {QUICK_PROMPTS} with "
                            "--quick)")
    bench.add_argument("--quick", action="store_true",
                       help="a short run: few prompts, short outputs (default: off)")
    bench.add_argument("--sample", action="store_true",
                       help="sampled decoding (temperature 0.7, top_p 0.9) instead of greedy (default: off)")
    bench.add_argument("--seed", type=int, default=0, help="seed of the sampled runs (default: %(default)s)")
    bench.add_argument("--out", type=str, default="bench-out", help="output folder (default: %(default)s)")
    bench.add_argument("--reuse-decoders", action="store_true",
                       help="one decoder per method for the whole run, carrying what it learns from prompt to "
                            "prompt (default: off, a fresh decoder per prompt)")
    _add_threads_arg(bench, None)
    bench.add_argument("--repeats", type=positive_int, default=1,
                       help="rounds of all methods per prompt; each method's time on a prompt is the median of "
                            "its rounds (default: %(default)s; 3 makes per-prompt ratios robust on a shared "
                            "machine)")
    bench.add_argument("--no-progress", action="store_true",
                       help="no progress bar (default: off, a progress bar is shown)")

    warm = sub.add_parser(
        "warmup", help="compile the kernels and keep the bundled model's converted weights (and cost curve)",
        description="Everything a first run would otherwise pay for, done once: compiles every Numba kernel "
                    "of the package (kept in Numba's on-disk cache), converts the bundled model's GGUF weights "
                    "and keeps them in the user's cache, and with --calibrate measures and keeps its cost "
                    "curve. Each phase prints a line when it starts and its time when it ends.")
    warm.add_argument("--no-weights", action="store_true",
                      help="skip converting the bundled model's weights (default: off, they are converted "
                           "and kept)")
    warm.add_argument("--calibrate", type=_name_list("dtype", lambda: ["float32", "bfloat16", "float16"]),
                      nargs="?", const=["float32"], default=None, metavar="DTYPES",
                      help="also measure and keep the bundled model's cost curve, for these comma-separated "
                           "dtypes (float32 when none is named; default: not calibrated)")
    _add_threads_arg(warm, "auto")

    from .heads_train import __doc__ as train_doc
    from .heads_train import add_arguments

    add_arguments(sub.add_parser(
        "train-heads", help="train draft heads for a model on its own answers (self-distillation)",
        description=train_doc.replace("``", ""), formatter_class=argparse.RawDescriptionHelpFormatter))
    from .heads_train import add_corpus_arguments

    add_corpus_arguments(sub.add_parser(
        "build-corpus", help="write a model's own answers as a draft corpus (LookaheadDecoder(corpus=...))",
        description="The model answers prompts greedily (by default, questions it writes itself from the package's "
                    "topic list, and one direct request per topic; every tenth topic held out), and the answers of "
                    "the training split are saved as OUT/corpus. LookaheadDecoder(corpus=DraftCorpus.load("
                    "'OUT/corpus')) then drafts the phrases this model tends to write from the first answer on; "
                    "the output stays exactly that of plain decoding. Resumable: a rerun continues from OUT/work."))
    return parser


def run_bench_command(args, argv: list[str]) -> int:
    import shlex

    import torch

    from lookahead.bench.methods import DEFAULT_METHODS
    from lookahead.bench.report import markdown, write_reports
    from lookahead.bench.runner import run_bench
    from lookahead.bench.workloads import WORKLOADS, build_workloads

    from .models import load_model

    n_prompts = args.prompts_per_workload or (QUICK_PROMPTS if args.quick else DEFAULT_PROMPTS)
    n_tokens = args.max_new_tokens or (QUICK_TOKENS if args.quick else DEFAULT_TOKENS)
    workload_names = args.workloads or list(WORKLOADS)
    method_names = args.methods or list(DEFAULT_METHODS)
    workloads = build_workloads(workload_names, n_prompts)
    from .console import contention_hint, set_threads

    threads = set_threads(args.threads)
    hint = contention_hint(threads) if args.threads is None else None
    if hint:
        print(hint, file=sys.stderr, flush=True)
    device = None if args.device == "auto" else args.device
    model, tok = load_model(args.model, dtype=getattr(torch, args.dtype), device=device, progress=True)
    if args.device == "auto" and torch.cuda.is_available():
        model = model.to("cuda")
    model_name = args.model or "SmolLM2-135M-Instruct (bundled, GGUF Q4_1 weights dequantised)"
    result = run_bench(model, tok, workloads, method_names, max_new_tokens=n_tokens, sample=args.sample,
                       seed=args.seed, progress=not args.no_progress, model_name=model_name,
                       command="python -m lookahead " + " ".join(shlex.quote(a) for a in argv),
                       fresh_per_prompt=not args.reuse_decoders, repeats=args.repeats)
    paths = write_reports(result, args.out)
    print(markdown(result))
    print("wrote " + ", ".join(paths.values()), file=sys.stderr)
    if result["mismatches"]:
        print(f"warning: {len(result['mismatches'])} greedy output(s) differ from plain generate; "
              f"see {paths['markdown']}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    from .console import logging_to_stderr

    with logging_to_stderr():  # the library's lines (loading, converting, calibrating) on stderr
        return _run(parser, args, argv)


def _run(parser: argparse.ArgumentParser, args, argv: list[str]) -> int:
    if args.command == "demo":
        from .demo import run_demo

        result = run_demo(args.max_new_tokens, args.prompt, args.model, dtype=args.dtype, device=args.device,
                          threads=args.threads, heads=args.heads, corpus=args.corpus)
        return 0 if result["identical"] and all(result.get(f"{k}_identical", True) for k in ("heads", "corpus")) else 1
    if args.command == "generate":
        from .cli_generate import run_generate

        return run_generate(args)
    if args.command == "bench":
        return run_bench_command(args, argv)
    if args.command == "warmup":
        from .console import set_threads
        from .warmup import run

        set_threads(args.threads)
        return run(weights=not args.no_weights, calibrate_dtypes=tuple(args.calibrate or ()))
    if args.command == "train-heads":
        from .heads_train import run_args

        return run_args(args)
    if args.command == "build-corpus":
        from .heads_train import run_corpus_args

        return run_corpus_args(args)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
