"""How big the library is, and how much of it a default call imports.

- the library: every line of ``lookahead/`` and ``cache/`` (docstrings, comments and blank lines included);
- a default greedy call on a CPU: the lines of the lookahead modules in ``sys.modules`` after
  ``model.generate(..., custom_generate=LookaheadDecoder())`` on a tiny random Llama (``--model smollm2``: the bundled
  SmolLM2-135M in fp32, which also finds its bundled corpus and times the CPU layouts).

Run from the repository root, in a fresh process::

    python -m benchmarks.size [--model smollm2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def lines(path: pathlib.Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def library() -> dict[str, int]:
    files = sorted((ROOT / "lookahead").rglob("*.py")) + sorted((ROOT / "cache").rglob("*.py"))
    return {str(f.relative_to(ROOT)): lines(f) for f in files}


def imported_by_a_call(model_name: str) -> dict[str, int]:
    """The lookahead modules a default call imports: those new in ``sys.modules`` after it (the bundled model's
    loader, a tool, is loaded before and not counted), and the package itself."""
    import torch

    if model_name == "smollm2":
        from lookahead.tools.models import load_smollm2

        model, tok = load_smollm2()
        ids = tok("def fib(n):", return_tensors="pt").input_ids
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2)).eval()
        ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])
    before = {n for n in sys.modules if n != "lookahead"}
    from lookahead import LookaheadDecoder

    model.generate(ids, max_new_tokens=16, do_sample=False, custom_generate=LookaheadDecoder())
    out = {}
    for name in sorted(set(sys.modules) - before):
        if name == "lookahead" or name.startswith("lookahead."):
            path = getattr(sys.modules[name], "__file__", None)
            if path and path.endswith(".py"):
                out[name] = lines(pathlib.Path(path))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    lib = library()
    call = imported_by_a_call(args.model)
    print(f"library (lookahead/ + cache/): {sum(lib.values())} lines in {len(lib)} files")
    print(f"a default greedy call on a CPU ({args.model}) imports {sum(call.values())} lines in {len(call)} modules:")
    for name, n in sorted(call.items(), key=lambda kv: -kv[1]):
        print(f"  {n:5d}  {name}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"library": lib, "default_call": call, "model": args.model},
                                                      indent=1))


if __name__ == "__main__":
    main()
