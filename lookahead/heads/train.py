"""Training draft heads by self-distillation: ``python -m lookahead train-heads --out DIR``.

The frozen model answers prompts greedily; the heads learn to predict, from each answer token's final hidden state,
the tokens that followed it (feature and context heads also the next hidden states, unrolled over their own
predictions for ``K`` levels). Stages, each resumable (kept under ``DIR/work``):

1. prompts: one per line of ``--prompts FILE``, or per topic of ``lookahead/data/topics.txt`` ``--questions``
   questions the model writes itself (sampled, seeded) and one direct request; every tenth one held out.
2. answers: greedy answers (``--max-new-tokens``), their hidden states in float16 shards; the training split's
   answers are also written as a draft corpus, ``DIR/corpus``.
3. tasks (unless ``--no-tasks``): requests on each chat topic's answer (summarise it, translate its opening, answer
   one of the topic's questions from it, a second turn of the chat) and arithmetic word problems (seeded).
4. raw code: the answers' code blocks, cut after the first function's docstring, continued as raw text.
5. vocabulary: the ``--vocab`` most frequent tokens of the training split's answers.
6. training (AdamW, cosine schedule, checkpoints), per-head temperatures fitted on the held-out split, and the
   held-out report (top-1 / top-k accuracy; wall and CPU seconds and peak memory per stage).

Writes ``DIR/<kind>/`` per kind and ``DIR/default.txt`` naming the kind with the longest held-out top-1 chain
(``DraftHeads.load(DIR)`` loads it).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
import resource
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields

import numpy as np
import torch
from torch import nn

from ..kept import DATA
from .context import unrolled_features
from .model import KINDS, DraftHeads, check_ints, invalid

TOPICS = os.path.join(DATA, "topics.txt")
HELD_OUT_EVERY = 10  # every this-many-th topic (or --prompts line) is held out
CORPUS_QUESTIONS = 2  # build-corpus's questions per topic (more of the model's own writing drafts more)
# what the model is asked to write a prompt about a topic itself, per topic kind; the prompt made of the topic
ASK = {"code": "Write a request that a user could send to a coding assistant, asking for {}. Write only the request, "
               "in one or two sentences.",
       "chat": "Write a question that a curious person could ask an assistant about {}. Write only the question."}
DIRECT = {"code": "Write {}. Give it a docstring and show a short example of its use.", "chat": "Tell me about {}."}
# the tasks stage's requests on a chat topic's answer (``text``), its opening (``opening``) and one of its questions
TASKS = {"summary": "Summarize the text below in a few sentences.\n\n{text}",
         "translation": "Translate this into {language}:\n\n{opening}",
         "reading": "Read the text, then answer the question.\n\nText:\n{text}\n\nQuestion: {question}"}
LANGUAGES = ("French", "Spanish", "German", "Italian", "Portuguese")
FOLLOW_UPS = ("Can you explain that more simply?", "Can you give me a concrete example?",
              "What are the most common mistakes people make with this?", "Can you make that shorter?")
# arithmetic word problems: a template, its numbers' ranges, and the request after it
PROBLEMS = (("{name} has {a} marbles, buys {b} more and gives {c} to a friend. How many marbles are left?",
             (20, 90), (5, 40), (1, 19)),
            ("A train travels at {a} km per hour for {b} hours, then at {c} km per hour for 2 hours. How far does it "
             "go in all?", (40, 120), (2, 6), (30, 90)),
            ("{name} reads {a} pages a day. A book has {b} pages, and {c} are already read. How many days are needed "
             "to finish it?", (10, 40), (200, 600), (10, 90)),
            ("A shop sells pens at {a} dollars each. {name} buys {b} pens and pays with {c} dollars. What is the "
             "change?", (2, 9), (2, 8), (80, 100)),
            ("A garden is {a} meters long and {b} meters wide. A path {c} meter wide runs around it outside. What is "
             "the area of the path?", (5, 30), (4, 20), (1, 3)),
            ("{name} saves {a} dollars a week. After {b} weeks {name} spends {c} dollars. How much is left?",
             (5, 50), (3, 20), (10, 60)))
NAMES = ("Maya", "Omar", "Lena", "Ravi", "Sofia", "Kenji", "Amara", "Luca", "Ines", "Tariq")


@dataclass(frozen=True)
class TrainSettings:
    """Settings of a training run (validated; see ``python -m lookahead train-heads --help``)."""

    kinds: tuple[str, ...] = ("feature",)
    num_heads: int = 4
    vocab: int = 4096
    max_new_tokens: int = 192
    raw_tokens: int = 128
    question_tokens: int = 48
    questions: int = 1
    tasks: bool = True
    batch_size: int = 32
    steps: int = 1200
    batch_rows: int = 256
    lr: float = 1e-3
    reg_weight: float = 0.5
    dropout: float = 0.0
    topk: int = 5
    checkpoint_every: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.kinds or any(k not in KINDS for k in self.kinds):
            raise invalid(self, "kinds", f"must be a non-empty tuple of {KINDS}")
        check_ints(self, {"num_heads": (1, 16), "vocab": (2, 1 << 20), "max_new_tokens": (2, 8192),
                          "raw_tokens": (0, 8192), "question_tokens": (4, 512), "questions": (0, 64),
                          "batch_size": (1, 1024), "steps": (0, 10**7), "batch_rows": (1, 1 << 16), "topk": (1, 100),
                          "checkpoint_every": (1, 10**7)})
        if not 0 < self.lr < 1:
            raise invalid(self, "lr", "must be in (0, 1)")
        if not 0 <= self.reg_weight <= 100:
            raise invalid(self, "reg_weight", "must be in [0, 100]")
        if not 0 <= self.dropout < 1:
            raise invalid(self, "dropout", "must be in [0, 1)")


@dataclass
class Rows:
    """Rows of many sequences, concatenated: ``hidden[i]`` (float16/32[N, H]) produced ``tokens[i]`` (int64[N]);
    ``ends[i]`` (int64[N]) is one past its sequence's last row."""

    hidden: np.ndarray
    tokens: np.ndarray
    ends: np.ndarray

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def of(cls, sequences: Sequence[tuple[np.ndarray, np.ndarray]]) -> Rows:
        """Rows of ``(hidden [T, H], tokens int64[T])`` sequences, in memory."""
        if not sequences:
            return cls(np.zeros((0, 0), np.float16), np.zeros(0, np.int64), np.zeros(0, np.int64))
        return cls(np.concatenate([h for h, _ in sequences]), np.concatenate([t for _, t in sequences]).astype(np.int64),
                   sequence_ends([len(t) for _, t in sequences]))

    def usable(self) -> np.ndarray:
        """The rows with a later row in their sequence (a target)."""
        return np.nonzero(np.arange(len(self)) + 1 < self.ends)[0]


def sequence_ends(lengths: Sequence[int]) -> np.ndarray:
    """int64[sum(lengths)]: per row, one past its sequence's last row. Example: ``[2, 3]`` -> ``[2, 2, 5, 5, 5]``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return np.repeat(np.cumsum(lengths), lengths)


def sequence_bounds(rows: Rows) -> tuple[np.ndarray, np.ndarray]:
    """(starts, lengths) int64[S] of the sequences of ``rows``."""
    ends = np.unique(rows.ends)
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    return starts, (ends - starts).astype(np.int64)


def generate_rows(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, max_new_tokens: int,
                  eos: Sequence[int], pad_token_id: int, **sample) -> list[tuple[np.ndarray, np.ndarray]]:
    """Greedy (with ``sample`` kwargs: sampled) continuations of a left-padded batch ``input_ids`` long[B, L]: per
    row ``(hidden float16[T, H], tokens int64[T])``, cut after the first end-of-sequence token; ``hidden[i]``, the
    final hidden state that produced token ``i``, is what the decoder hands ``HeadsSource.observe_hidden``."""
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                             min_new_tokens=1, pad_token_id=pad_token_id, eos_token_id=list(eos) or None,
                             do_sample=bool(sample), output_hidden_states=True, return_dict_in_generate=True,
                             **sample)
    new = out.sequences[:, input_ids.shape[1]:].cpu().numpy().astype(np.int64)  # [B, T]
    hidden = torch.stack([s[-1][:, -1].to("cpu", torch.float16) for s in out.hidden_states[: new.shape[1]]], 1)
    is_end = np.isin(new, np.asarray(list(eos), dtype=np.int64))
    lengths = np.where(is_end.any(1), is_end.argmax(1) + 1, new.shape[1])  # through the first end-of-sequence
    return [(hidden[b, :n].numpy(), new[b, :n]) for b, n in enumerate(lengths.tolist())]


def answers_of(model, tokenizer, texts: Sequence[str], chat: bool, max_new_tokens: int, eos: Sequence[int],
               pad: int, **sample) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`generate_rows` of ``texts``, left-padded; ``chat``: through the chat template, where a text may also
    be a list of turns, the user's first."""
    special = not (chat and getattr(tokenizer, "chat_template", None))
    if not special:
        turns = [[t] if isinstance(t, str) else list(t) for t in texts]
        texts = [tokenizer.apply_chat_template([{"role": ("user", "assistant")[i % 2], "content": c}
                                                for i, c in enumerate(chat)], add_generation_prompt=True,
                                               tokenize=False) for chat in turns]
    enc = tokenizer(list(texts), return_tensors="pt", padding=True, padding_side="left",
                    add_special_tokens=special)
    ids, mask = enc["input_ids"].to(model.device), enc["attention_mask"].to(model.device)
    return generate_rows(model, ids, mask, max_new_tokens, eos, pad, **sample)


def read_topics(path: str | None = None) -> list[tuple[str, str]]:
    """(``"chat"`` or ``"code"``, topic) pairs of a topics file (``kind: topic`` per line, ``#`` comments)."""
    out = []
    with open(path or TOPICS, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            kind, sep, topic = (s.strip() for s in line.partition(":"))
            if not sep or kind not in ("chat", "code") or not topic:
                raise ValueError(f"{path or TOPICS}:{n}: expected 'chat: TOPIC' or 'code: TOPIC', got {line.strip()!r}")
            out.append((kind, topic))
    return out


def code_prefix(answer: str, max_lines: int = 12) -> str | None:
    """A raw code-completion prompt from an answer's first code block: its lines up to the end of the first
    function's docstring (HumanEval's shape), else its first three lines; None without a code block of 3+ lines."""
    start = answer.find("```")
    if start < 0:
        return None
    lines = answer[answer.find("\n", start) + 1:].split("```")[0].split("\n")
    if len([line for line in lines if line.strip()]) < 3:
        return None
    cut = None
    for i, line in enumerate(lines[:max_lines]):
        if line.lstrip().startswith("def ") and i + 1 < len(lines):
            quote = lines[i + 1].strip()[:3]
            if quote in ('"""', "'''"):
                cut = next((j + 1 for j in range(i + 1, min(len(lines), i + 1 + max_lines))
                            if quote in (lines[j].strip()[3:] if j == i + 1 else lines[j])), None)
            else:
                cut = i + 1
            break
    return "\n".join(lines[: cut or 3]) + "\n"


def vocab_by_frequency(tokens: np.ndarray, size: int, always: Iterable[int] = ()) -> np.ndarray:
    """int64[<= size]: ``always`` first, then the most frequent of ``tokens`` (ties: the smaller id)."""
    always = [int(t) for t in always]
    ids, counts = np.unique(np.asarray(tokens, dtype=np.int64), return_counts=True)
    chosen = always + [int(t) for t in ids[np.lexsort((ids, -counts))] if int(t) not in set(always)]
    return np.array(chosen[:size], dtype=np.int64)


class Batch:
    """Per query ``n`` (row ``idx[n]``) and level ``k``: ``target`` int64[N, K] (vocabulary positions, -100: none),
    ``valid``, :attr:`truth` float32[N, K, H] (the true next features), ``hidden`` float32[N, H], ``inputs`` int64[N,
    K] (the token level ``k`` is fed). A context head's (:meth:`answers`) holds whole answers instead: ``hidden``
    float32[S, T, H], ``tokens`` int64[S, T] (zero past an answer), query ``positions`` int64[S, P]; ``N = S * P``."""

    def __init__(self, rows: Rows, idx: np.ndarray, vocab_ids: np.ndarray, levels: int):
        at = idx[:, None] + np.arange(1, levels + 1)[None, :]  # [N, K]: the row whose token level k predicts
        self.valid = at < rows.ends[idx][:, None]
        self._rows, self._truth_at = rows, np.where(self.valid, at, idx[:, None])
        lookup = np.full(max(int(vocab_ids.max()), int(rows.tokens.max(initial=0))) + 1, -100, np.int64)
        lookup[vocab_ids] = np.arange(len(vocab_ids))  # token -> its vocabulary position, -100 where absent
        self.target = np.where(self.valid, lookup[rows.tokens[self._truth_at]], -100)
        self.inputs = rows.tokens[np.where(self.valid, at - 1, idx[:, None])]
        self.hidden = np.asarray(rows.hidden[idx], dtype=np.float32)
        self.tokens = self.positions = None

    @classmethod
    def answers(cls, rows: Rows, starts: np.ndarray, lengths: np.ndarray, positions: np.ndarray,
                vocab_ids: np.ndarray, levels: int) -> Batch:
        b = cls(rows, (starts[:, None] + positions).reshape(-1), vocab_ids, levels)
        inside = np.arange(int(lengths.max()))[None, :] < lengths[:, None]  # [S, T]
        at = np.where(inside, starts[:, None] + np.arange(inside.shape[1])[None, :], starts[:, None])
        b.hidden = np.where(inside[..., None], np.asarray(rows.hidden[at], dtype=np.float32), 0.0).astype(np.float32)
        b.tokens, b.positions = np.where(inside, rows.tokens[at], 0), positions
        return b

    @classmethod
    def sampled(cls, rows: Rows, bounds, rng: np.random.Generator, batch_rows: int, vocab_ids: np.ndarray,
                levels: int, per_answer: int = 32) -> Batch:
        """A context head's training batch: ``batch_rows // per_answer`` answers, drawn in proportion to their rows,
        with ``per_answer`` query positions each (drawn with replacement)."""
        starts, lengths = bounds
        usable = np.nonzero(lengths >= 2)[0]
        weights = (lengths[usable] - 1) / (lengths[usable] - 1).sum()
        chosen = rng.choice(usable, size=max(1, batch_rows // per_answer), p=weights)
        positions = rng.integers(0, lengths[chosen, None] - 1, (len(chosen), per_answer))
        return cls.answers(rows, starts[chosen], lengths[chosen], positions, vocab_ids, levels)

    @property
    def truth(self) -> np.ndarray:
        return np.asarray(self._rows.hidden[self._truth_at], dtype=np.float32)


def frozen_parts(model, vocab_ids: np.ndarray):
    """What training reads of the frozen model, on the CPU in float32: its LM-head rows of ``vocab_ids`` [Vk, H],
    their bias [Vk] or None, and its input embedding as a function ids long[N] -> float32[N, H]."""
    out, embed = model.get_output_embeddings(), model.get_input_embeddings()
    ids = torch.from_numpy(np.asarray(vocab_ids, dtype=np.int64)).to(out.weight.device)
    bias = getattr(out, "bias", None)

    def lookup(ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return embed(ids.to(embed.weight.device)).float().cpu()

    return out.weight.detach()[ids].float().cpu(), None if bias is None else bias.detach()[ids].float().cpu(), lookup


def level_outputs(heads: DraftHeads, b: Batch, weight, bias, embed) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logits float[N, K, Vk], features float[N, K, H] or None for Medusa) of ``heads`` on batch ``b``: the
    feature head unrolled over its own features fed the true tokens (an accepted path), the context head over whole
    answers (``unrolled_features``)."""
    K, h = heads.num_heads, torch.from_numpy(b.hidden)
    if heads.kind == "medusa":
        return heads.medusa_logits(heads.medusa_hidden(h), weight, bias), None
    if heads.kind == "context":
        embedded = embed(torch.from_numpy(b.tokens))
        features = unrolled_features(heads.context, h, embedded, torch.from_numpy(b.positions), K).flatten(0, 1)
    else:
        out, feature = [], h
        for k in range(K):
            feature = heads.feature_step(feature, embed(torch.from_numpy(b.inputs[:, k])))
            out.append(feature)
        features = torch.stack(out, 1)
    return nn.functional.linear(features, weight, bias), features


def batch_loss(heads: DraftHeads, b: Batch, weight, bias, embed, reg_weight: float = 0.5):
    """(the loss, float[K] cross-entropy per level): each level's token cross-entropy (0 without a target in the
    vocabulary), plus for the feature and context heads ``reg_weight`` times a smooth-L1 loss to the true next
    hidden state; level ``k`` weighs ``0.8 ** (k - 1)`` (Medusa's), the weights summing to 1."""
    K = heads.num_heads
    logits, features = level_outputs(heads, b, weight, bias, embed)
    target, valid = torch.from_numpy(b.target), torch.from_numpy(b.valid)
    truth = None if features is None else torch.from_numpy(b.truth)  # [N, K, H]
    ce, reg = torch.zeros(K), torch.zeros(K)
    for k in range(K):
        scored = bool((target[:, k] >= 0).any())  # (-100: ignored; with none scored, 0 that still has a gradient)
        ce[k] = nn.functional.cross_entropy(logits[:, k], target[:, k]) if scored else logits.sum() * 0.0
        if features is not None and valid[:, k].any():
            reg[k] = nn.functional.smooth_l1_loss(features[:, k][valid[:, k]], truth[:, k][valid[:, k]])
    weights = 0.8 ** torch.arange(K, dtype=torch.float32)
    return (weights / weights.sum() * (ce + reg_weight * reg)).sum(), ce.detach()


def train_heads(heads: DraftHeads, rows: Rows, model, steps: int, batch_rows: int = 256, lr: float = 1e-3,
                seed: int = 0, reg_weight: float = 0.5, progress: bool = False, checkpoint: str | None = None,
                checkpoint_every: int = 200, until: int | None = None) -> list[float]:
    """Train ``heads`` in place on ``rows`` for ``steps`` AdamW steps (warm-up, then cosine); the loss of every
    step. Batch ``i`` is drawn with seed ``(seed, i)``, so a run resumed from ``checkpoint`` (written every
    ``checkpoint_every`` steps) trains exactly as one that never stopped. ``until``: stop (checkpointed) there."""
    weight, bias, embed = frozen_parts(model, heads.vocab_ids.numpy())
    usable, vocab_ids, K = rows.usable(), heads.vocab_ids.numpy(), heads.num_heads
    if not len(usable):
        raise ValueError("no training rows: every sequence has a single token")
    heads.train()
    params = [p for p in heads.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    warm = max(1, min(50, steps // 10))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(i, steps) / max(steps, 1))))
    parts, losses, start = {"heads": heads, "optimizer": opt, "schedule": sched}, [], 0
    if checkpoint and os.path.exists(checkpoint):
        state = torch.load(checkpoint, weights_only=False)
        for key, part in parts.items():
            part.load_state_dict(state[key])
        losses, start = list(state["losses"]), int(state["step"])
    stop = steps if until is None else min(steps, until)
    bar = _bar(range(start, stop), progress, f"training {heads.kind} heads", initial=start, total=steps)
    bounds = sequence_bounds(rows) if heads.kind == "context" else None
    for step in bar:
        rng = np.random.default_rng((seed, step))
        b = (Batch.sampled(rows, bounds, rng, batch_rows, vocab_ids, K) if bounds is not None
             else Batch(rows, usable[rng.integers(0, len(usable), batch_rows)], vocab_ids, K))
        loss, ce = batch_loss(heads, b, weight, bias, embed, reg_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if progress:
            bar.set_postfix(loss=f"{losses[-1]:.3f}", head1=f"{float(ce[0]):.2f}")
        if checkpoint and ((step + 1) % checkpoint_every == 0 or step + 1 == stop):
            state = {key: part.state_dict() for key, part in parts.items()} | {"losses": losses, "step": step + 1}
            _atomic(functools.partial(torch.save, state), checkpoint)
    heads.eval()
    return losses


def scored_batches(heads: DraftHeads, rows: Rows, usable: np.ndarray, weight, bias, embed, batch: int):
    """Per batch of the rows ``usable``: (logits float[B, K, Vk], target long[B, K], valid bool[B, K]); a context
    head reads whole answers (each usable row a query position in its own answer)."""
    K, vocab_ids = heads.num_heads, heads.vocab_ids.numpy()
    if heads.kind != "context":
        for lo in range(0, len(usable), batch):
            b = Batch(rows, usable[lo: lo + batch], vocab_ids, K)
            yield level_outputs(heads, b, weight, bias, embed)[0], torch.from_numpy(b.target), b.valid
        return
    starts, lengths = sequence_bounds(rows)
    seq_of = np.searchsorted(starts, usable, side="right") - 1
    answers = np.unique(seq_of)
    per = max(1, batch // int(lengths[answers].max(initial=1)))  # answers per batch: about `batch` rows
    for lo in range(0, len(answers), per):
        chosen = answers[lo: lo + per]
        queries = [usable[seq_of == a] - starts[a] for a in chosen]
        p = max(len(q) for q in queries)
        positions = np.stack([np.pad(q, (0, p - len(q)), mode="edge") for q in queries])  # [S, P]
        real = (np.arange(p)[None, :] < np.array([len(q) for q in queries])[:, None]).reshape(-1)  # not padding
        b = Batch.answers(rows, starts[chosen], lengths[chosen], positions, vocab_ids, K)
        logits = level_outputs(heads, b, weight, bias, embed)[0]
        yield logits[torch.from_numpy(real)], torch.from_numpy(b.target[real]), b.valid[real]


@torch.no_grad()
def evaluate(heads: DraftHeads, rows: Rows, model, topk: int = 5, max_rows: int = 20000, batch: int = 512,
             temperatures: Sequence[float] = ()) -> dict:
    """Held-out figures of ``heads`` on the first ``max_rows`` usable ``rows``: per level ``top1`` and ``top{topk}``
    accuracy over the full vocabulary (a target outside the heads' vocabulary is a miss), ``coverage`` (targets
    inside it), ``chain`` (the mean length of the right top-1 prefix: the tokens a top-1 chain gets accepted), and
    with ``temperatures`` the mean negative log-likelihood of in-vocabulary targets at each (``nll`` [K, T])."""
    weight, bias, embed = frozen_parts(model, heads.vocab_ids.numpy())
    K, usable, temps = heads.num_heads, rows.usable()[:max_rows], [float(t) for t in temperatures]
    counts = np.zeros((4, K))  # per level: right top-1, right top-k, valid, in the vocabulary (and valid)
    nll, chain_total, chain_rows = np.zeros((K, len(temps))), 0.0, 0
    heads.eval()
    for logits, target, valid in scored_batches(heads, rows, usable, weight, bias, embed, batch):
        top = logits.topk(min(topk, logits.shape[-1]), -1).indices  # [B, K, topk]
        right1, rightk = (top[..., 0] == target).numpy(), (top == target[..., None]).any(-1).numpy()
        counts += (np.stack([right1, rightk, valid, target.numpy() >= 0]) & valid).sum(1)
        full = valid.all(1)  # rows whose K next tokens all exist: the chain is measured on them
        chain_total += float(np.cumprod(right1[full], 1).sum())
        chain_rows += int(full.sum())
        for j, temp in enumerate(temps):
            logp = torch.log_softmax(logits / temp, -1).gather(-1, target.clamp(min=0)[..., None])[..., 0]  # [B, K]
            nll[:, j] -= (logp * (target >= 0)).sum(0).numpy()
    hit1, hitk, count, covered = counts
    n = np.maximum(count, 1)
    result = {"rows": int(len(usable)), "top1": (hit1 / n).round(4).tolist(),
              f"top{topk}": (hitk / n).round(4).tolist(), "coverage": (covered / n).round(4).tolist(),
              "chain": round(chain_total / max(chain_rows, 1), 4)}
    if temps:
        result["nll"] = (nll / np.maximum(covered, 1)[:, None]).tolist()
    return result


def calibrate(heads: DraftHeads, rows: Rows, model, grid: Sequence[float] | None = None) -> list[float]:
    """Set each head's temperature to the one of ``grid`` with the least held-out negative log-likelihood."""
    grid = list(grid or np.round(np.exp(np.linspace(np.log(0.25), np.log(4.0), 25)), 4))
    nll = np.asarray(evaluate(heads, rows, model, max_rows=8000, temperatures=grid)["nll"])  # [K, T]
    best = [float(grid[int(i)]) for i in nll.argmin(1)]
    heads.temperature.copy_(torch.tensor(best))
    return best


def _bar(it, progress: bool, desc: str, **kw):
    if not progress:
        return it
    from tqdm.auto import tqdm

    return tqdm(it, desc=desc, dynamic_ncols=True, **kw)


def _atomic(write, path: str) -> None:
    """``write(a binary file)``, then move the file to ``path`` (a stage interrupted midway leaves no half file)."""
    with open(path + ".tmp", "wb") as f:
        write(f)
    os.replace(path + ".tmp", path)


def _atomic_json(obj, path: str) -> None:
    _atomic(lambda f: f.write(json.dumps(obj, indent=1).encode()), path)


def _read_json(path: str, make=None):
    """The JSON in ``path``; where it is missing, ``make()``'s, written there first (a stage's kept result)."""
    if not os.path.exists(path):
        _atomic_json(make(), path)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _split(key: int) -> str:
    return "held-out" if key % HELD_OUT_EVERY == HELD_OUT_EVERY - 1 else "train"


class ShardStore:
    """Generated rows on disk, per shard: ``NAME.hidden.npy`` (float16 [N, H]), ``NAME.tokens.npy`` (int64[N]) and
    ``NAME.json`` (per sequence: length, prompt id, split, texts), its JSON written last: a shard whose JSON exists is
    complete."""

    def __init__(self, folder: str):
        self.folder = folder
        os.makedirs(folder, exist_ok=True)

    def path(self, name: str, suffix: str = "json") -> str:
        return os.path.join(self.folder, f"{name}.{suffix}")

    def write(self, name: str, sequences: list[tuple[np.ndarray, np.ndarray]], meta: list[dict]) -> None:
        for suffix, arr in (("hidden", np.concatenate([h for h, _ in sequences]).astype(np.float16)),
                            ("tokens", np.concatenate([t for _, t in sequences]).astype(np.int64))):
            _atomic(functools.partial(np.save, arr=arr), self.path(name, suffix + ".npy"))
        _atomic_json([dict(m, length=int(len(t))) for m, (_, t) in zip(meta, sequences)], self.path(name))

    def meta(self, prefix: str = "") -> list[tuple[str, list[dict]]]:
        """(name, per-sequence meta) of every shard ``prefix...``."""
        names = sorted(f[:-5] for f in os.listdir(self.folder) if f.endswith(".json") and f.startswith(prefix))
        return [(name, _read_json(self.path(name))) for name in names]

    def sequences(self, prefix: str, split: str, arrays: tuple[str, ...] = ("hidden", "tokens")):
        """[memory-mapped rows of each of ``arrays``] of every ``split`` sequence in shards ``prefix...``."""
        for name, meta in self.meta(prefix):
            opened = [np.load(self.path(name, a + ".npy"), mmap_mode="r") for a in arrays]
            for m, end in zip(meta, np.cumsum([m["length"] for m in meta]).tolist()):
                if m["split"] == split:
                    yield [x[end - m["length"]: end] for x in opened]

    def rows(self, split: str, out_path: str) -> Rows:
        """The rows of every shard's ``split`` sequences, merged into one memory-mapped file ``out_path``."""
        chosen = list(self.sequences("", split))
        if not chosen:
            return Rows.of([])
        lengths = [len(t) for _, t in chosen]
        hidden = np.lib.format.open_memmap(out_path, mode="w+", dtype=np.float16,
                                           shape=(sum(lengths), chosen[0][0].shape[1]))
        for (h, _), end in zip(chosen, np.cumsum(lengths).tolist()):
            hidden[end - len(h): end] = h
        hidden.flush()
        tokens = np.concatenate([t for _, t in chosen]).astype(np.int64)
        return Rows(np.load(out_path, mmap_mode="r"), tokens, sequence_ends(lengths))


def write_prompts(model, tok, topics: list[tuple[str, str]], settings: TrainSettings, progress: bool,
                  eos: list[int], pad: int) -> list[dict]:
    """Per topic, ``settings.questions`` questions the model writes itself (sampled, seeded) and the direct request;
    a topic's prompts share its split."""
    torch.manual_seed(settings.seed)
    items = [{"id": f"t{n}-d", "topic": topic, "kind": kind, "split": _split(n), "text": DIRECT[kind].format(topic)}
             for n, (kind, topic) in enumerate(topics)]
    asks = [(n, j) for n in range(len(topics)) for j in range(settings.questions)]
    for lo in _bar(range(0, len(asks), settings.batch_size), progress, "prompts: writing"):
        chunk = asks[lo: lo + settings.batch_size]
        seqs = answers_of(model, tok, [ASK[topics[n][0]].format(topics[n][1]) for n, _ in chunk], True,
                          settings.question_tokens, eos, pad, temperature=0.8, top_p=0.95)
        for (n, j), (_, t) in zip(chunk, seqs):
            text = tok.decode(t, skip_special_tokens=True).strip().strip('"').strip()
            if "```" not in text and "def " not in text and len(text) >= 12:  # a request, not code
                items.append({**items[n], "id": f"t{n}-q{j}", "text": text[:400]})
    return items


def task_items(items: list[dict], answers: dict[str, str], seed: int) -> list[dict]:
    """The tasks stage's prompts: per chat topic whose direct request (id ``t{n}-d``) has an answer of 80+
    characters in ``answers`` (id -> text), each of :data:`TASKS` and a second turn, sharing the topic's split; then
    as many word problems as there are such topics (every tenth held out)."""
    rng = np.random.default_rng(seed)
    asked: dict[str, list[str]] = {}
    for item in items:
        if item.get("kind") == "chat" and "-q" in item["id"]:
            asked.setdefault(item["id"].split("-")[0], []).append(item["text"])
    out = []
    for item in items:
        text, topic = answers.get(item["id"], "").strip(), item["id"].split("-")[0]
        if item.get("kind") != "chat" or not item["id"].endswith("-d") or len(text) < 80:
            continue
        ends = [i + 1 for i, ch in enumerate(text[:400]) if ch in ".!?"]
        questions = asked.get(topic) or ["What is the main point of the text?"]
        fields = {"text": text, "opening": text[: ends[min(1, len(ends) - 1)]] if ends else text[:200],
                  "language": LANGUAGES[rng.integers(len(LANGUAGES))],
                  "question": questions[rng.integers(len(questions))]}
        out += [{**item, "id": f"{topic}-{name}", "text": form.format(**fields)} for name, form in TASKS.items()]
        turns = [item["text"], text, FOLLOW_UPS[rng.integers(len(FOLLOW_UPS))]]
        out.append({**item, "id": f"{topic}-turn2", "text": turns})
    for n in range(len(out) // (len(TASKS) + 1)):
        template, *ranges = PROBLEMS[n % len(PROBLEMS)]
        a, b, c = (int(rng.integers(low, high + 1)) for low, high in ranges)
        text = template.format(name=NAMES[rng.integers(len(NAMES))], a=a, b=b, c=c)
        out.append({"id": f"m{n}", "kind": "math", "split": _split(n), "text": text + " Explain each step, then "
                    "state the result."})
    return out


def run(out: str, model, tok, settings: TrainSettings, prompts_file: str | None = None,
        topics_file: str | None = None, progress: bool = True, model_name: str = "", train: bool = True) -> dict:
    """Every stage (see the module docstring), resuming from ``out/work``; the report. Writes the training split's
    answers as ``out/corpus``; ``train=False`` stops there (no heads)."""
    from ..corpus import DraftCorpus

    work = os.path.join(out, "work")
    store = ShardStore(os.path.join(work, "shards"))
    eos_ids = model.generation_config.eos_token_id
    eos = [int(e) for e in (eos_ids if isinstance(eos_ids, (list, tuple)) else [eos_ids]) if e is not None]
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
    times_path = os.path.join(work, "times.json")
    times: dict[str, float] = _read_json(times_path, dict)

    def timed(stage: str, fn):  # wall seconds, CPU seconds (what other work cannot inflate), peak memory so far
        t, c = time.perf_counter(), time.process_time()
        result = fn()
        times[stage] = times.get(stage, 0.0) + time.perf_counter() - t
        times[stage + " (cpu)"] = times.get(stage + " (cpu)", 0.0) + time.process_time() - c
        cuda = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_initialized() else 0.0
        peak = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 + cuda, 1)  # a resumed run's: no less
        times[stage + " (peak MiB)"] = max(times.get(stage + " (peak MiB)", 0.0), peak)
        _atomic_json(times, times_path)
        return result

    def generate(prefix: str, items: list[dict], max_new_tokens: int, chat: bool) -> None:
        """Greedy answers of ``items`` (``text``, ``id``, ``split``) into shards ``prefix-NNNN`` that are missing."""
        order = sorted(range(len(items)), key=lambda i: len(str(items[i]["text"])))  # similar lengths pad less
        batches = [order[i: i + settings.batch_size] for i in range(0, len(order), settings.batch_size)]
        for b, chosen in _bar(list(enumerate(batches)), progress, f"{prefix}: generating"):
            if not os.path.exists(store.path(name := f"{prefix}-{b:04d}")):
                seqs = answers_of(model, tok, [items[i]["text"] for i in chosen], chat, max_new_tokens, eos, pad)
                store.write(name, seqs, [{"id": items[i]["id"], "split": items[i]["split"], "prompt": items[i]["text"],
                                          "answer": tok.decode(t, skip_special_tokens=True)}
                                         for i, (_, t) in zip(chosen, seqs)])

    def prompt_items() -> list[dict]:
        if not prompts_file:
            topics = read_topics(topics_file)
            return timed("prompts", lambda: write_prompts(model, tok, topics, settings, progress, eos, pad))
        with open(prompts_file, encoding="utf-8") as f:
            lines = [line.strip() for line in f if line.strip()]
        return [{"id": f"p{i}", "kind": "file", "split": _split(i), "text": line} for i, line in enumerate(lines)]

    items = _read_json(os.path.join(work, "prompts.json"), prompt_items)
    timed("answers", lambda: generate("answers", items, settings.max_new_tokens, True))
    prompts = (f"to the prompts of {os.path.basename(prompts_file)}" if prompts_file else
               f"to prompts written from {os.path.basename(topics_file or TOPICS)} (chat and code topics): per topic "
               f"{settings.questions} questions the model wrote itself and a direct request")
    streams = [np.array(tokens) for (tokens,) in store.sequences("answers", "train", ("tokens",))]
    corpus = DraftCorpus.from_streams(streams, model, {
        "data": f"the model's own greedy answers (one stream per answer) {prompts}", "model": model_name,
        "split": f"train (every {HELD_OUT_EVERY}th topic/prompt held out)",
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "max_new_tokens": settings.max_new_tokens, "seed": settings.seed})
    corpus.save(os.path.join(out, "corpus"))
    report = {"times": times, "prompts": len(items)}
    if not train:
        report["corpus"] = {"streams": corpus.streams, "tokens": len(corpus)}
        _atomic_json(report, os.path.join(out, "report.json"))
        return report
    if settings.tasks:
        tasks = _read_json(os.path.join(work, "tasks.json"), lambda: task_items(
            items, {m["id"]: m["answer"] for _, meta in store.meta("answers") for m in meta}, settings.seed))
        timed("tasks", lambda: generate("tasks", tasks, settings.max_new_tokens, True))
    if settings.raw_tokens:
        raw = [{"id": m["id"] + "-raw", "split": m["split"], "text": code_prefix(m["answer"])}
               for _, meta in store.meta("answers") for m in meta]
        timed("raw", lambda: generate("raw", [r for r in raw if r["text"]], settings.raw_tokens, False))
    train_rows = store.rows("train", os.path.join(work, "train.hidden.npy"))
    held = store.rows("held-out", os.path.join(work, "held-out.hidden.npy"))
    vocab = vocab_by_frequency(train_rows.tokens, settings.vocab, always=eos)
    with open(prompts_file or topics_file or TOPICS, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    described = {
        "data": f"self-distillation: the model's own greedy answers, with the hidden states that produced them, "
                f"{prompts}" + (", requests built on its chat answers (summaries, translations, reading questions, "
                                "second turns) and arithmetic word problems" if settings.tasks else "")
                + (", and raw continuations of the code in its answers" if settings.raw_tokens else ""),
        "model": model_name, "prompts": len(items), "prompts_sha256": digest, "train_rows": len(train_rows),
        "held_out_rows": len(held), "held_out": f"every {HELD_OUT_EVERY}th topic/prompt", "settings": asdict(settings)}
    results, curves = {}, {}
    for kind in settings.kinds:
        torch.manual_seed(settings.seed)
        heads = DraftHeads.for_model(model, kind, settings.num_heads, vocab, dropout=settings.dropout)
        losses = timed(f"train-{kind}", lambda heads=heads, kind=kind: train_heads(
            heads, train_rows, model, settings.steps, settings.batch_rows, settings.lr, settings.seed,
            settings.reg_weight, progress, os.path.join(work, f"train-{kind}.pt"), settings.checkpoint_every))
        temps = calibrate(heads, held, model) if len(held) else [1.0] * settings.num_heads
        acc = evaluate(heads, held, model, settings.topk) if len(held) else {}
        edges = np.linspace(0, len(losses), min(200, len(losses)) + 1).astype(int)  # the loss curve, 200 spans
        curve = [[int(b), round(float(np.mean(losses[a:b])), 4)] for a, b in zip(edges[:-1], edges[1:])]
        heads.trained_on = dict(described, held_out_accuracy=acc, temperature=temps, loss_curve=curve,
                                times={k: round(v, 1) for k, v in times.items()})
        heads.save(os.path.join(out, kind))
        results[kind] = {"accuracy": acc, "temperature": temps,
                         "final_loss": float(np.mean(losses[-50:])) if losses else None}
        curves[kind] = losses
    best = max(results, key=lambda k: results[k]["accuracy"].get("chain", 0.0))
    with open(os.path.join(out, "default.txt"), "w", encoding="utf-8") as f:
        f.write(best + "\n")
    report.update(default=best, train_rows=len(train_rows), held_out_rows=len(held), results=results, losses=curves,
                  vocab_coverage_train=float(np.isin(train_rows.tokens, vocab).mean()) if len(train_rows) else 0.0)
    _atomic_json(report, os.path.join(out, "report.json"))
    return report


def parse_kinds(text: str) -> tuple[str, ...]:
    """The kinds ``--kind`` names: one, several joined by commas, ``"both"`` (Medusa and feature) or ``"all"``."""
    if text in ("all", "both"):
        return KINDS if text == "all" else ("medusa", "feature")
    kinds = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    if not kinds or any(k not in KINDS for k in kinds):
        raise argparse.ArgumentTypeError(f"--kind {text!r}: expected kinds among {', '.join(KINDS)}, 'both' or 'all'")
    return kinds


def _option(p: argparse.ArgumentParser, flag: str, default, text: str, **kw) -> None:
    """``flag`` of a number's type (else ``kw["type"]``), its help ``text`` ending in the default unless it names one."""
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        kw.setdefault("type", type(default))
    p.add_argument(flag, default=default, help=text if "default:" in text else text + " (default: %(default)s)", **kw)


def _add_data_arguments(p: argparse.ArgumentParser, what: str, questions: int) -> None:
    d = TrainSettings()
    p.add_argument("--out", required=True, help=f"output folder ({what}, report, and work/ for resuming)")
    _option(p, "--model", None, "a local causal LM folder (default: the bundled SmolLM2-135M)")
    _option(p, "--prompts", None, "a file of prompts, one per line (default: written by the model from the package's "
            "topic list)")
    _option(p, "--topics", None, "a topics file ('chat: ...' / 'code: ...' lines; default: the package's "
            "lookahead/data/topics.txt)")
    _option(p, "--questions", questions, "questions the model writes per topic, beside the direct request")
    _option(p, "--max-new-tokens", d.max_new_tokens, "answer length")
    _option(p, "--batch-size", d.batch_size, "prompts per generate")
    _option(p, "--seed", d.seed, "seed")
    _option(p, "--threads", None, "torch CPU threads (default: torch's choice)", type=int)
    _option(p, "--device", "auto", "cpu, cuda, ...; auto: cuda if present")
    _option(p, "--dtype", "auto", "the model's dtype; auto: bfloat16 on a CPU with AMX-BF16 or on CUDA, else float32",
            choices=["auto", "float32", "bfloat16"])
    _option(p, "--no-progress", False, "no progress bars (default: off, bars are shown)", action="store_true")


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The training run's options on ``p`` (``python -m lookahead train-heads``)."""
    d = TrainSettings()
    _add_data_arguments(p, "heads, corpus/", d.questions)
    _option(p, "--kind", "feature", f"heads to train: one of {', '.join(KINDS)}, several joined by commas, 'both' "
            "(medusa,feature) or 'all'", type=parse_kinds, dest="kinds")
    _option(p, "--heads", d.num_heads, "K", dest="num_heads", metavar="HEADS")
    _option(p, "--vocab", d.vocab, "tokens the heads predict")
    _option(p, "--raw-tokens", d.raw_tokens, "raw code continuation length, 0: none")
    _option(p, "--no-tasks", False, "no tasks stage: only the answers to the topics' requests (default: off, the "
            "tasks are written and answered)", action="store_true")
    _option(p, "--steps", d.steps, "training steps per kind")
    _option(p, "--batch-rows", d.batch_rows, "rows per step")
    _option(p, "--lr", d.lr, "peak learning rate")
    _option(p, "--dropout", d.dropout, "dropout on the heads' inputs and hidden layer while training")
    return p


def add_corpus_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``python -m lookahead build-corpus``: the answer-writing stages of a training run."""
    _add_data_arguments(p, "corpus/", CORPUS_QUESTIONS)
    _option(p, "--no-install", False, "only write OUT/corpus, do not also install it in the user cache, where "
            "LookaheadDecoder() finds it for this model (corpus=\"auto\") (default: installed)", action="store_true")
    return p


def run_args(args: argparse.Namespace) -> int:
    """A training run from parsed :func:`add_arguments` options; prints the held-out accuracy."""
    report, seconds, _ = _run_loaded(args, True, tasks=not args.no_tasks)
    k = TrainSettings.topk
    for kind, r in report["results"].items():
        acc = r["accuracy"]
        print(f"{kind}: held-out top-1 {acc.get('top1')}, top-{k} {acc.get(f'top{k}')}, top-1 chain {acc.get('chain')}")
    print(f"wrote {args.out} (default: {report['default']}) in {seconds:.0f} s", file=sys.stderr)
    return 0


def run_corpus_args(args: argparse.Namespace) -> int:
    """``build-corpus`` from parsed :func:`add_corpus_arguments` options: the model's answers as ``OUT/corpus``."""
    report, seconds, model = _run_loaded(args, False)
    c, written = report["corpus"], os.path.join(args.out, "corpus")
    print(f"wrote {written}: {c['streams']} answers, {c['tokens']} tokens, in {seconds:.0f} s; use it "
          "as LookaheadDecoder(corpus=DraftCorpus.load(...))", file=sys.stderr)
    if not args.no_install:
        from ..corpus import DraftCorpus
        from ..user_cache import persist_enabled

        if persist_enabled():
            folder = DraftCorpus.load(written, model=model).install()
            print(f"installed it in {folder}: LookaheadDecoder() drafts from it for this model with no argument "
                  "(--no-install: do not)", file=sys.stderr)
        else:
            print("not installed: the user cache is turned off (LOOKAHEAD_PERSIST)", file=sys.stderr)
    return 0


def _run_loaded(args: argparse.Namespace, train: bool, **more):
    """(the report, seconds, the model): :func:`run` with the :class:`TrainSettings` of the options named as its
    fields and ``more``, on the model ``--model``, ``--device``, ``--dtype`` and ``--threads`` ask for."""
    settings = TrainSettings(**{f.name: getattr(args, f.name) for f in fields(TrainSettings) if hasattr(args, f.name)},
                             **more)
    from ..tools.console import set_threads
    from ..tools.models import load_model

    set_threads(args.threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    dtype = args.dtype
    if dtype == "auto":
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                amx = "amx_bf16" in f.read()
        except OSError:
            amx = False
        dtype = "bfloat16" if amx or device.startswith("cuda") else "float32"
    dtype = getattr(torch, dtype)
    print(f"loading {args.model or 'the bundled SmolLM2-135M-Instruct'} ({str(dtype).replace('torch.', '')}, "
          f"{device}) ...", file=sys.stderr, flush=True)
    model, tok = load_model(args.model, dtype=dtype, device=device)
    t = time.perf_counter()
    report = run(args.out, model, tok, settings, args.prompts, args.topics, not args.no_progress,
                 args.model or "SmolLM2-135M-Instruct (bundled)", train=train)
    return report, time.perf_counter() - t, model
