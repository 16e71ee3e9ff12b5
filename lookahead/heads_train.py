"""Training draft heads by self-distillation: ``python -m lookahead train-heads --out DIR``.

The model answers prompts greedily; every answer token's hidden state (the input of the output embedding,
captured with a forward pre-hook during batched, left-padded ``generate``) is stored with the tokens that
followed it, and the heads (``heads.py``) learn the model's own continuations from its own hidden states:
Medusa head ``k`` the token ``k`` after the one the row produced, the feature head the next hidden state
and token, unrolled over its own predictions for ``K`` levels. The model itself stays frozen.

Stages, each resumable (its results are kept under ``DIR/work``; a rerun continues where one stopped):

1. prompts: one per line from ``--prompts FILE``, or by default written from ``lookahead/data/topics.txt``
   (chat and code topics): per topic ``--questions`` questions the model writes itself (sampled, seeded) and
   one direct request made from the topic line. Every tenth topic (or prompt) is held out.
2. answers: greedy answers (``--max-new-tokens``) in batches, stored as float16 hidden states in shards.
3. raw code: the code blocks of the model's own answers, cut after the first function's docstring (or
   its first lines), continued as raw text (no chat template), as a code-completion request is.
4. vocabulary: the ``--vocab`` most frequent tokens of the training split's answers.
5. training (AdamW, cosine schedule, checkpoints every ``--checkpoint-every`` steps), calibration of one
   temperature per head on the held-out split, and the held-out report (per-head top-1 / top-k accuracy).

Writes ``DIR/<kind>/`` (``DraftHeads.save``) per trained kind and ``DIR/default.txt`` naming the kind with
the longest held-out top-1 chain; ``DraftHeads.load(DIR)`` loads that one. Memory stays bounded: hidden
states go to disk shard by shard, and training reads them memory-mapped.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from .context_head import unrolled_features
from .corpus import DraftCorpus
from .heads import KINDS, DraftHeads

TOPICS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "topics.txt")
HELD_OUT_EVERY = 10
"""Every this-many-th topic (or prompt, with ``--prompts``) is held out."""


@dataclass(frozen=True)
class TrainSettings:
    """Settings of a training run (all validated; see ``python -m lookahead train-heads --help``)."""

    kinds: tuple[str, ...] = ("feature",)
    num_heads: int = 4
    vocab: int = 4096
    max_new_tokens: int = 192
    raw_tokens: int = 128
    question_tokens: int = 48
    questions: int = 1
    batch_size: int = 32
    steps: int = 1200
    batch_rows: int = 256
    lr: float = 1e-3
    reg_weight: float = 0.5
    topk: int = 5
    checkpoint_every: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        def bad(name, why):
            return ValueError(f"TrainSettings.{name}={getattr(self, name)!r} is invalid: {why}")

        if not self.kinds or any(k not in KINDS for k in self.kinds):
            raise bad("kinds", f"must be a non-empty tuple of {KINDS}")
        for name, low, high in (("num_heads", 1, 16), ("vocab", 2, 1 << 20), ("max_new_tokens", 2, 8192),
                                ("raw_tokens", 0, 8192), ("question_tokens", 4, 512), ("questions", 0, 64), ("batch_size", 1, 1024),
                                ("steps", 0, 10**7), ("batch_rows", 1, 1 << 16), ("topk", 1, 100),
                                ("checkpoint_every", 1, 10**7)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise bad(name, f"must be an int in [{low}, {high}]")
        if not 0 < self.lr < 1:
            raise bad("lr", "must be in (0, 1)")
        if not 0 <= self.reg_weight <= 100:
            raise bad("reg_weight", "must be in [0, 100]")


# ------------------------------------------------------------------------------------------------- data


@dataclass
class Rows:
    """Training rows of many sequences, concatenated: row ``i``'s ``hidden`` float16/32[N, H] produced
    ``tokens[i]`` (int64[N], the model's greedy token); ``ends[i]`` (int64[N]) is one past its sequence's last
    row. Medusa head ``k`` learns ``tokens[i + k]`` from ``hidden[i]`` where ``i + k < ends[i]``."""

    hidden: np.ndarray
    tokens: np.ndarray
    ends: np.ndarray

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def of(cls, sequences: Sequence[tuple[np.ndarray, np.ndarray]]) -> Rows:
        """Rows of ``(hidden [T, H], tokens int64[T])`` sequences, in memory."""
        hidden = np.concatenate([h for h, _ in sequences]) if sequences else np.zeros((0, 0), np.float16)
        tokens = np.concatenate([t for _, t in sequences]).astype(np.int64) if sequences else np.zeros(0, np.int64)
        return cls(hidden, tokens, sequence_ends([len(t) for _, t in sequences]))


def sequence_ends(lengths: Sequence[int]) -> np.ndarray:
    """int64[sum(lengths)]: for every row, one past the last row of its sequence.

    Example: ``sequence_ends([2, 3])`` -> ``[2, 2, 5, 5, 5]``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return np.repeat(np.cumsum(lengths), lengths)


def trim_at_eos(tokens: np.ndarray, eos: Iterable[int]) -> int:
    """How many of ``tokens`` (int[T]) to keep: up to and including the first end-of-sequence token."""
    hits = np.nonzero(np.isin(tokens, np.asarray(list(eos), dtype=np.int64)))[0]
    return int(hits[0]) + 1 if len(hits) else len(tokens)


def generate_rows(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, max_new_tokens: int,
                  eos: Sequence[int], pad_token_id: int, **sample) -> list[tuple[np.ndarray, np.ndarray]]:
    """Greedy (or, with ``sample`` kwargs, sampled) continuations of a left-padded batch ``input_ids``
    long[B, L], with the hidden state that produced each new token: per row ``(hidden float16[T, H],
    tokens int64[T])``, cut after the first end-of-sequence token. The hidden states are the input of
    ``model.get_output_embeddings()`` at the last position of each forward (a forward pre-hook), exactly
    what the decoder hands ``HeadsSource.observe_hidden``."""
    captured: list[torch.Tensor] = []

    def keep(module, args):
        captured.append(args[0][:, -1].detach().to("cpu", torch.float16))  # [B, H]

    handle = model.get_output_embeddings().register_forward_pre_hook(keep)
    try:
        with torch.no_grad():
            out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                                 min_new_tokens=1, pad_token_id=pad_token_id, eos_token_id=list(eos) or None,
                                 do_sample=bool(sample), **sample)
    finally:
        handle.remove()
    new = out[:, input_ids.shape[1]:].cpu().numpy().astype(np.int64)  # [B, T]
    hidden = torch.stack(captured[: new.shape[1]], 1).numpy()  # [B, T, H]
    rows = []
    for b in range(new.shape[0]):
        n = trim_at_eos(new[b], eos)
        rows.append((hidden[b, :n], new[b, :n]))
    return rows


def left_padded(tokenizer, texts: Sequence[str], chat: bool, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids long[B, L], attention mask long[B, L]) of ``texts``, left-padded; ``chat``: each text is a
    user message through the tokenizer's chat template."""
    if chat and getattr(tokenizer, "chat_template", None):
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                               tokenize=False) for t in texts]
        special = False
    else:
        special = True
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        enc = tokenizer(list(texts), return_tensors="pt", padding=True, add_special_tokens=special)
    finally:
        tokenizer.padding_side = side
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


# ---------------------------------------------------------------------------------------------- prompts


def read_topics(path: str | None = None) -> list[tuple[str, str]]:
    """(kind ``"chat"`` or ``"code"``, topic) pairs from a topics file (``kind: topic`` per line, ``#`` comments)."""
    out = []
    with open(path or TOPICS, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            kind, sep, topic = line.partition(":")
            if not sep or kind.strip() not in ("chat", "code") or not topic.strip():
                raise ValueError(f"{path or TOPICS}:{n}: expected 'chat: TOPIC' or 'code: TOPIC', got {line!r}")
            out.append((kind.strip(), topic.strip()))
    return out


def question_instruction(kind: str, topic: str) -> str:
    """What the model is asked in order to write a prompt about ``topic`` itself."""
    if kind == "code":
        return (f"Write a request that a user could send to a coding assistant, asking for {topic}. "
                "Write only the request, in one or two sentences.")
    return f"Write a question that a curious person could ask an assistant about {topic}. Write only the question."


def direct_request(kind: str, topic: str) -> str:
    """The prompt made from the topic line itself."""
    if kind == "code":
        return f"Write {topic}. Give it a docstring and show a short example of its use."
    return f"Tell me about {topic}."


def clean_question(text: str) -> str | None:
    """The model-written prompt, or None when it is unusable (too short, or code instead of a request)."""
    text = text.strip().strip('"').strip()
    if "```" in text or "def " in text or len(text) < 12:
        return None
    return text[:400]


def code_prefix(answer: str, max_lines: int = 12) -> str | None:
    """A raw code-completion prompt from an answer's first code block: its lines up to the end of the first
    function's docstring (HumanEval's shape), else its first three lines; None without a code block.

    Example: an answer with ``def f(x):`` / ``    \"\"\"Double x.\"\"\"`` / ``    return 2 * x`` in a
    fenced block gives its first two lines and a newline."""
    start = answer.find("```")
    if start < 0:
        return None
    body = answer[answer.find("\n", start) + 1:]
    end = body.find("```")
    lines = (body if end < 0 else body[:end]).split("\n")
    if len([line for line in lines if line.strip()]) < 3:
        return None
    cut = None
    for i, line in enumerate(lines[:max_lines]):
        if line.lstrip().startswith("def ") and i + 1 < len(lines):
            quote = lines[i + 1].strip()[:3]
            if quote in ('"""', "'''"):
                for j in range(i + 1, min(len(lines), i + 1 + max_lines)):
                    if quote in (lines[j].strip()[3:] if j == i + 1 else lines[j]):
                        cut = j + 1
                        break
            else:
                cut = i + 1
            break
    cut = cut or 3
    return "\n".join(lines[:cut]) + "\n"


# -------------------------------------------------------------------------------------------- training


def vocab_by_frequency(tokens: np.ndarray, size: int, always: Iterable[int] = ()) -> np.ndarray:
    """int64[<= size]: the ``size`` most frequent of ``tokens`` (ties: the smaller id), ``always`` first."""
    always = [int(t) for t in always]
    ids, counts = np.unique(np.asarray(tokens, dtype=np.int64), return_counts=True)
    order = np.lexsort((ids, -counts))
    chosen = always + [int(t) for t in ids[order] if int(t) not in set(always)]
    return np.array(chosen[:size], dtype=np.int64)


def positions_in(vocab_ids: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """int64[...]: the position of each of ``tokens`` in ``vocab_ids``, -100 (ignored by the loss) where absent."""
    lookup = np.full(max(int(vocab_ids.max()), int(tokens.max(initial=0))) + 1, -100, np.int64)
    lookup[vocab_ids] = np.arange(len(vocab_ids))
    return lookup[tokens]


class Targets:
    """What a batch of rows trains on: for rows ``idx`` int64[B] of ``rows``, per level ``k = 1..K`` the
    target vocabulary positions ``target`` int64[B, K] (-100 where ignored), the input tokens of the feature
    head ``inputs`` int64[B, K] (the token each level starts from) and ``valid`` bool[B, K]."""

    def __init__(self, rows: Rows, idx: np.ndarray, vocab_ids: np.ndarray, levels: int):
        k = np.arange(1, levels + 1)
        at = idx[:, None] + k[None, :]  # [B, K]: the row whose token level k predicts
        self.valid = at < rows.ends[idx][:, None]
        safe = np.where(self.valid, at, idx[:, None])
        self.target = np.where(self.valid, positions_in(vocab_ids, rows.tokens[safe]), -100)
        self.inputs = rows.tokens[np.where(self.valid, at - 1, idx[:, None])]
        self.next_rows = safe  # [B, K]: the row whose hidden state level k's feature should match


def sequence_bounds(rows: Rows) -> tuple[np.ndarray, np.ndarray]:
    """(starts int64[S], lengths int64[S]) of the sequences ``rows`` concatenates.

    Example: rows of sequences of 2 and 3 tokens (``ends`` ``[2, 2, 5, 5, 5]``) -> ``[0, 2]``, ``[2, 3]``."""
    ends = np.unique(rows.ends)
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    return starts, (ends - starts).astype(np.int64)


class ContextBatch:
    """What a batch of whole answers trains a context head on: sequences ``starts[chosen]`` (lengths
    ``lengths[chosen]``), padded to the longest, with query positions ``positions`` int64[S, P] (each below its
    answer's length minus one). ``hidden`` float32[S, T, H] and ``tokens`` int64[S, T] (zero past an answer's end);
    per query and level ``k = 1..K``: ``target`` int64[S, P, K] (vocabulary positions, -100 where ignored),
    ``valid`` bool[S, P, K], ``truth`` float32[S, P, K, H] (the true next hidden state ``f_{p+k}``)."""

    def __init__(self, rows: Rows, starts: np.ndarray, lengths: np.ndarray, positions: np.ndarray,
                 vocab_ids: np.ndarray, levels: int):
        t = int(lengths.max())
        inside = np.arange(t)[None, :] < lengths[:, None]  # [S, T]
        at = np.where(inside, starts[:, None] + np.arange(t)[None, :], starts[:, None])  # [S, T] row indices
        self.hidden = np.where(inside[..., None], np.asarray(rows.hidden[at.reshape(-1)], dtype=np.float32)
                               .reshape(*at.shape, -1), 0.0).astype(np.float32)
        self.tokens = np.where(inside, rows.tokens[at], 0)
        self.positions = positions
        ahead = positions[:, :, None] + np.arange(1, levels + 1)[None, None, :]  # [S, P, K]
        self.valid = ahead < lengths[:, None, None]
        safe = np.where(self.valid, ahead, positions[:, :, None])
        seq = np.arange(len(starts))[:, None, None]
        self.target = np.where(self.valid, positions_in(vocab_ids, self.tokens[seq, safe]), -100)
        self.truth = self.hidden[seq, safe]


def context_logits(heads: DraftHeads, batch: ContextBatch, weight: torch.Tensor, bias, embed) -> tuple[
        torch.Tensor, torch.Tensor]:
    """(logits float[S, P, K, Vk], features float[S, P, K, H]) of a context head on a :class:`ContextBatch`."""
    with torch.no_grad():
        embedded = embed(torch.from_numpy(batch.tokens))  # [S, T, H]
    features = unrolled_features(heads.context, torch.from_numpy(batch.hidden), embedded,
                                 torch.from_numpy(batch.positions), heads.num_heads)
    return nn.functional.linear(features, weight, bias), features


def sample_context_batch(rows: Rows, bounds: tuple[np.ndarray, np.ndarray], rng: np.random.Generator,
                         batch_rows: int, vocab_ids: np.ndarray, levels: int, per_answer: int = 32) -> ContextBatch:
    """``batch_rows // per_answer`` answers (drawn in proportion to their rows, as a row batch draws rows), and
    ``per_answer`` query positions in each (drawn with replacement)."""
    starts, lengths = bounds
    usable = np.nonzero(lengths >= 2)[0]
    weights = (lengths[usable] - 1) / (lengths[usable] - 1).sum()
    chosen = rng.choice(usable, size=max(1, batch_rows // per_answer), p=weights)
    positions = rng.integers(0, lengths[chosen, None] - 1, (len(chosen), per_answer))
    return ContextBatch(rows, starts[chosen], lengths[chosen], positions, vocab_ids, levels)


def head_weight(model, vocab_ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(float32 [Vk, H], bias float32 [Vk] or None): the model's LM-head rows of ``vocab_ids`` on the CPU."""
    out = model.get_output_embeddings()
    ids = torch.from_numpy(np.asarray(vocab_ids, dtype=np.int64)).to(out.weight.device)
    w = out.weight.detach()[ids].float().cpu()
    b = None if getattr(out, "bias", None) is None else out.bias.detach()[ids].float().cpu()
    return w, b


def level_weights(levels: int, decay: float = 0.8) -> torch.Tensor:
    """float[K]: the loss weight of each head / level (Medusa's ``0.8 ** (k - 1)``), summing to 1."""
    w = decay ** torch.arange(levels, dtype=torch.float32)
    return w / w.sum()


def batch_loss(heads: DraftHeads, rows: Rows, idx, weight: torch.Tensor, bias, embed,
               reg_weight: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """(the weighted loss, float[K] cross-entropy per level) of the heads on rows ``idx`` (a context head: on a
    :class:`ContextBatch`).

    Medusa: cross-entropy of each head's prediction. Feature: the head is unrolled from ``hidden[idx]``
    over its own predicted features, fed the true tokens (the accepted path), with cross-entropy on each
    level's token plus ``reg_weight`` times a smooth-L1 loss to the true next hidden state. Context: the same,
    unrolled from each query position of whole answers (``context_head.unrolled_features``)."""
    K = heads.num_heads
    lw = level_weights(K)
    if heads.kind == "context":
        logits, features = context_logits(heads, idx, weight, bias, embed)
        target, valid = torch.from_numpy(idx.target), torch.from_numpy(idx.valid)
        truth = torch.from_numpy(idx.truth)
        ce, reg = torch.zeros(K), torch.zeros(K)
        for k in range(K):
            ce[k] = _ce(logits[:, :, k].flatten(0, 1), target[:, :, k].flatten())
            mask = valid[:, :, k]
            if mask.any():
                reg[k] = nn.functional.smooth_l1_loss(features[:, :, k][mask], truth[:, :, k][mask])
        return (lw * (ce + reg_weight * reg)).sum(), ce.detach()
    t = Targets(rows, idx, heads.vocab_ids.numpy(), K)
    target = torch.from_numpy(t.target)  # [B, K]
    h = torch.from_numpy(np.asarray(rows.hidden[idx], dtype=np.float32))  # [B, H]
    ce = torch.zeros(K)
    if heads.kind == "medusa":
        logits = heads.medusa_logits(heads.medusa_hidden(h), weight, bias)  # [B, K, Vk]
        for k in range(K):
            ce[k] = _ce(logits[:, k], target[:, k])
        return (lw * ce).sum(), ce.detach()
    reg = torch.zeros(K)
    feature = h
    valid = torch.from_numpy(t.valid)
    for k in range(K):
        with torch.no_grad():
            emb = embed(torch.from_numpy(t.inputs[:, k])).float()  # [B, H]
        feature = heads.feature_step(feature, emb)
        ce[k] = _ce(nn.functional.linear(feature, weight, bias), target[:, k])
        truth = torch.from_numpy(np.asarray(rows.hidden[t.next_rows[:, k]], dtype=np.float32))
        mask = valid[:, k]
        if mask.any():
            reg[k] = nn.functional.smooth_l1_loss(feature[mask], truth[mask])
    return (lw * (ce + reg_weight * reg)).sum(), ce.detach()


def _ce(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if not bool((target >= 0).any()):
        return logits.sum() * 0.0
    return nn.functional.cross_entropy(logits, target, ignore_index=-100)


def train_heads(heads: DraftHeads, rows: Rows, model, steps: int, batch_rows: int = 256, lr: float = 1e-3,
                seed: int = 0, reg_weight: float = 0.5, progress: bool = False, checkpoint: str | None = None,
                checkpoint_every: int = 200, weight_decay: float = 0.0, until: int | None = None) -> list[float]:
    """Train ``heads`` in place on ``rows`` for ``steps`` AdamW steps (cosine schedule after a short warm-up);
    returns the loss of every step. Batch ``i`` draws ``batch_rows`` rows with seed ``(seed, i)``, so a run
    resumed from ``checkpoint`` (a file, written every ``checkpoint_every`` steps) trains exactly as one that
    never stopped. ``until``: stop (checkpointed) after that step, to resume later."""
    weight, bias = head_weight(model, heads.vocab_ids.numpy())
    embed = model.get_input_embeddings()
    embed_cpu = _cpu_embedding(embed)
    usable = np.nonzero(np.arange(len(rows)) + 1 < rows.ends)[0]  # rows with at least one target
    if not len(usable):
        raise ValueError("no training rows: every sequence has a single token")
    heads.train()
    params = [p for p in heads.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    warm = max(1, min(50, steps // 10))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(i, steps) / max(steps, 1))))
    losses: list[float] = []
    start = 0
    if checkpoint and os.path.exists(checkpoint):
        state = torch.load(checkpoint, weights_only=False)
        heads.load_state_dict(state["heads"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["schedule"])
        losses, start = list(state["losses"]), int(state["step"])
    stop = steps if until is None else min(steps, until)
    bar = _bar(range(start, stop), progress, f"training {heads.kind} heads", initial=start, total=steps)
    bounds = sequence_bounds(rows) if heads.kind == "context" else None
    vocab_ids = heads.vocab_ids.numpy()
    for step in bar:
        rng = np.random.default_rng((seed, step))
        if bounds is not None:
            idx = sample_context_batch(rows, bounds, rng, batch_rows, vocab_ids, heads.num_heads)
        else:
            idx = usable[rng.integers(0, len(usable), batch_rows)]
        loss, ce = batch_loss(heads, rows, idx, weight, bias, embed_cpu, reg_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if progress and hasattr(bar, "set_postfix"):
            bar.set_postfix(loss=f"{losses[-1]:.3f}", head1=f"{float(ce[0]):.2f}")
        if checkpoint and ((step + 1) % checkpoint_every == 0 or step + 1 == stop):
            _atomic_save({"heads": heads.state_dict(), "optimizer": opt.state_dict(), "schedule": sched.state_dict(),
                          "losses": losses, "step": step + 1}, checkpoint)
    heads.eval()
    return losses


def _cpu_embedding(embed: nn.Module):
    """A function ids long[N] (CPU) -> the model's input embeddings float32[N, H] on the CPU."""
    device = next(embed.parameters()).device

    def lookup(ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return embed(ids.to(device)).float().cpu()

    return lookup


@torch.no_grad()
def evaluate(heads: DraftHeads, rows: Rows, model, topk: int = 5, max_rows: int = 20000, batch: int = 512,
             temperatures: Sequence[float] = ()) -> dict:
    """Held-out figures of ``heads`` on ``rows`` (the first ``max_rows`` usable rows): per head / level
    ``top1`` and ``topk`` accuracy over the full vocabulary (a target outside the heads' vocabulary counts as
    a miss), ``coverage`` (targets inside it), ``chain``: the mean length of the top-1 prefix that is right
    (the tokens a top-1 chain would get accepted), and with ``temperatures`` the mean negative
    log-likelihood of in-vocabulary targets at each (float[K, T], for calibration)."""
    weight, bias = head_weight(model, heads.vocab_ids.numpy())
    embed = _cpu_embedding(model.get_input_embeddings())
    K = heads.num_heads
    usable = np.nonzero(np.arange(len(rows)) + 1 < rows.ends)[0][:max_rows]
    hit1, hitk, count, covered = np.zeros(K), np.zeros(K), np.zeros(K), np.zeros(K)
    temps = torch.tensor(list(temperatures), dtype=torch.float32)
    nll = np.zeros((K, len(temps)))
    chain_total, chain_rows = 0.0, 0
    heads.eval()
    for logits, target, valid in _evaluated(heads, rows, usable, weight, bias, embed, batch):
        top = logits.topk(min(topk, logits.shape[-1]), -1).indices  # [B, K, topk]
        right1 = (top[..., 0] == target).numpy()
        rightk = (top == target[..., None]).any(-1).numpy()
        target_np = target.numpy()
        hit1 += (right1 & valid).sum(0)
        hitk += (rightk & valid).sum(0)
        count += valid.sum(0)
        covered += ((target_np >= 0) & valid).sum(0)
        full = valid.all(1)  # rows whose K next tokens all exist: the chain is measured on them
        chain_total += float(np.cumprod(right1[full], 1).sum())
        chain_rows += int(full.sum())
        inside = target >= 0
        for j, temp in enumerate(temps.tolist()):
            logp = torch.log_softmax(logits / temp, -1).gather(-1, target.clamp(min=0)[..., None])[..., 0]  # [B, K]
            nll[:, j] -= (logp * inside).sum(0).numpy()
    n = np.maximum(count, 1)
    result = {"rows": int(len(usable)), "top1": (hit1 / n).round(4).tolist(), f"top{topk}": (hitk / n).round(4).tolist(),
              "coverage": (covered / n).round(4).tolist(), "chain": round(chain_total / max(chain_rows, 1), 4)}
    if len(temps):
        result["nll"] = (nll / np.maximum(covered, 1)[:, None]).tolist()
    return result


def _evaluated(heads: DraftHeads, rows: Rows, usable: np.ndarray, weight, bias, embed, batch: int):
    """Per batch of the rows ``usable``: (logits float[B, K, Vk], target long[B, K], valid bool[B, K]); a context
    head reads whole answers (each usable row is a query position in its own answer)."""
    K = heads.num_heads
    vocab_ids = heads.vocab_ids.numpy()
    if heads.kind == "context":
        starts, lengths = sequence_bounds(rows)
        seq_of = np.searchsorted(starts, usable, side="right") - 1
        answers = np.unique(seq_of)
        per = max(1, batch // int(lengths[answers].max(initial=1)))  # answers per batch, about ``batch`` rows
        for lo in range(0, len(answers), per):
            chosen = answers[lo: lo + per]
            queries = [usable[seq_of == a] - starts[a] for a in chosen]
            p = max(len(q) for q in queries)
            positions = np.stack([np.pad(q, (0, p - len(q)), mode="edge") for q in queries])  # [S, P]
            real = np.arange(p)[None, :] < np.array([len(q) for q in queries])[:, None]  # [S, P]: not padding
            b = ContextBatch(rows, starts[chosen], lengths[chosen], positions, vocab_ids, K)
            logits, _ = context_logits(heads, b, weight, bias, embed)
            yield logits[real], torch.from_numpy(b.target[real]), b.valid[real]
        return
    for lo in range(0, len(usable), batch):
        idx = usable[lo: lo + batch]
        t = Targets(rows, idx, vocab_ids, K)
        h = torch.from_numpy(np.asarray(rows.hidden[idx], dtype=np.float32))
        if heads.kind == "medusa":
            logits = heads.medusa_logits(heads.medusa_hidden(h), weight, bias)  # [B, K, Vk]
        else:
            feature, out = h, []
            for k in range(K):
                feature = heads.feature_step(feature, embed(torch.from_numpy(t.inputs[:, k])))
                out.append(nn.functional.linear(feature, weight, bias))
            logits = torch.stack(out, 1)
        yield logits, torch.from_numpy(t.target), t.valid


def calibrate(heads: DraftHeads, rows: Rows, model, grid: Sequence[float] | None = None) -> list[float]:
    """Set each head's temperature to the one of ``grid`` with the least held-out negative log-likelihood."""
    grid = list(grid or np.round(np.exp(np.linspace(np.log(0.25), np.log(4.0), 25)), 4))
    nll = np.asarray(evaluate(heads, rows, model, max_rows=8000, temperatures=grid)["nll"])  # [K, T]
    best = [float(grid[int(i)]) for i in nll.argmin(1)]
    heads.temperature.copy_(torch.tensor(best))
    return best


# ------------------------------------------------------------------------------------------- the run


def _bar(it, progress: bool, desc: str, **kw):
    if not progress:
        return it
    from tqdm.auto import tqdm

    return tqdm(it, desc=desc, dynamic_ncols=True, **kw)


def _atomic_save(obj, path: str) -> None:
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _atomic_json(obj, path: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def _held_out(key: int) -> bool:
    return key % HELD_OUT_EVERY == HELD_OUT_EVERY - 1


class ShardStore:
    """Generated rows on disk: per shard ``NAME.hidden.npy`` (float16 [N, H]), ``NAME.tokens.npy`` (int64[N]),
    ``NAME.json`` (sequence lengths, prompt ids, splits, texts). A shard is written once, atomically (its
    JSON last), so a rerun skips the shards that exist."""

    def __init__(self, folder: str):
        self.folder = folder
        os.makedirs(folder, exist_ok=True)

    def has(self, name: str) -> bool:
        return os.path.exists(os.path.join(self.folder, name + ".json"))

    def write(self, name: str, sequences: list[tuple[np.ndarray, np.ndarray]], meta: list[dict]) -> None:
        hidden = np.concatenate([h for h, _ in sequences]).astype(np.float16)
        tokens = np.concatenate([t for _, t in sequences]).astype(np.int64)
        for suffix, arr in (("hidden", hidden), ("tokens", tokens)):
            tmp = os.path.join(self.folder, f"{name}.{suffix}.tmp.npy")
            np.save(tmp, arr)
            os.replace(tmp, os.path.join(self.folder, f"{name}.{suffix}.npy"))
        info = [dict(m, length=int(len(t))) for m, (_, t) in zip(meta, sequences)]
        _atomic_json(info, os.path.join(self.folder, name + ".json"))

    def names(self, prefix: str = "") -> list[str]:
        return sorted(f[:-5] for f in os.listdir(self.folder) if f.endswith(".json") and f.startswith(prefix))

    def meta(self, name: str) -> list[dict]:
        with open(os.path.join(self.folder, name + ".json"), encoding="utf-8") as f:
            return json.load(f)

    def rows(self, split: str, out_path: str) -> Rows:
        """The rows of every shard's ``split`` sequences, merged into one memory-mapped file ``out_path``."""
        pieces, total, width = [], 0, None
        for name in self.names():
            meta = self.meta(name)
            offsets = np.cumsum([0] + [m["length"] for m in meta])
            chosen = [(int(offsets[i]), int(offsets[i + 1])) for i, m in enumerate(meta) if m["split"] == split]
            if chosen:
                pieces.append((name, chosen))
                total += sum(b - a for a, b in chosen)
        lengths: list[int] = []
        tokens = np.zeros(total, np.int64)
        hidden = None
        at = 0
        for name, chosen in pieces:
            h = np.load(os.path.join(self.folder, f"{name}.hidden.npy"), mmap_mode="r")
            t = np.load(os.path.join(self.folder, f"{name}.tokens.npy"), mmap_mode="r")
            if hidden is None:
                width = h.shape[1]
                hidden = np.lib.format.open_memmap(out_path, mode="w+", dtype=np.float16, shape=(int(total), int(width)))
            for a, b in chosen:
                hidden[at: at + b - a] = h[a:b]
                tokens[at: at + b - a] = t[a:b]
                lengths.append(int(b - a))
                at += b - a
        if hidden is None:
            return Rows(np.zeros((0, 0), np.float16), tokens, np.zeros(0, np.int64))
        hidden.flush()
        return Rows(np.load(out_path, mmap_mode="r"), tokens, sequence_ends(lengths))


def _generate_stage(model, tok, store: ShardStore, prefix: str, items: list[dict], max_new_tokens: int,
                    batch_size: int, chat: bool, progress: bool, eos: list[int], pad: int) -> None:
    """Greedy answers of ``items`` (dicts with ``text``, ``id``, ``split``) into shards ``prefix-NNNN``."""
    order = sorted(range(len(items)), key=lambda i: len(items[i]["text"]))  # similar lengths pad less
    batches = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    bar = _bar(list(enumerate(batches)), progress, f"{prefix}: generating")
    for b, chosen in bar:
        name = f"{prefix}-{b:04d}"
        if store.has(name):
            continue
        ids, mask = left_padded(tok, [items[i]["text"] for i in chosen], chat, model.device)
        seqs = generate_rows(model, ids, mask, max_new_tokens, eos, pad)
        meta = [{"id": items[i]["id"], "split": items[i]["split"], "prompt": items[i]["text"],
                 "answer": tok.decode(t, skip_special_tokens=True)} for i, (_, t) in zip(chosen, seqs)]
        store.write(name, seqs, meta)


def write_prompts(model, tok, topics: list[tuple[str, str]], settings: TrainSettings, progress: bool,
                  eos: list[int], pad: int) -> list[dict]:
    """Per topic, ``settings.questions`` questions the model writes itself (sampled, seeded) and the direct
    request; a topic's prompts share its split."""
    torch.manual_seed(settings.seed)
    items = [{"id": f"t{n}-d", "topic": topic, "kind": kind, "split": "held-out" if _held_out(n) else "train",
              "text": direct_request(kind, topic)} for n, (kind, topic) in enumerate(topics)]
    asks = [(n, j) for n in range(len(topics)) for j in range(settings.questions)]
    bs = settings.batch_size
    for lo in _bar(range(0, len(asks), bs), progress, "prompts: writing"):
        chunk = asks[lo: lo + bs]
        ids, mask = left_padded(tok, [question_instruction(*topics[n]) for n, _ in chunk], True, model.device)
        seqs = generate_rows(model, ids, mask, settings.question_tokens, eos, pad, temperature=0.8, top_p=0.95)
        for (n, j), (_, t) in zip(chunk, seqs):
            written = clean_question(tok.decode(t, skip_special_tokens=True))
            if written:
                items.append({**items[n], "id": f"t{n}-q{j}", "text": written})
    return items


def corpus_of(store: ShardStore, split: str, model, described: dict) -> DraftCorpus:
    """The answers (shards ``answers-*``) of ``split`` as a :class:`~lookahead.corpus.DraftCorpus` of ``model``,
    one stream per answer."""
    streams = []
    for name in store.names("answers"):
        tokens = np.load(os.path.join(store.folder, f"{name}.tokens.npy"), mmap_mode="r")
        at = 0
        for m in store.meta(name):
            if m["split"] == split:
                streams.append(np.array(tokens[at: at + m["length"]]))
            at += m["length"]
    return DraftCorpus.from_streams(streams, model, described)


def run(out: str, model, tok, settings: TrainSettings, prompts_file: str | None = None,
        topics_file: str | None = None, progress: bool = True, model_name: str = "", train: bool = True) -> dict:
    """Every stage (see the module docstring), resuming from ``out/work``; returns the report. Writes the
    training split's answers as ``out/corpus`` (``DraftCorpus.save``); ``train=False`` stops there (no heads)."""
    work = os.path.join(out, "work")
    os.makedirs(work, exist_ok=True)
    store = ShardStore(os.path.join(work, "shards"))
    eos_ids = model.generation_config.eos_token_id
    eos = [int(e) for e in (eos_ids if isinstance(eos_ids, (list, tuple)) else [eos_ids]) if e is not None]
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
    times: dict[str, float] = {}
    report_path = os.path.join(work, "times.json")
    if os.path.exists(report_path):
        with open(report_path, encoding="utf-8") as f:
            times = json.load(f)

    def timed(stage: str, fn):  # wall seconds, and the process's CPU seconds (what other work cannot inflate)
        t, c = time.perf_counter(), time.process_time()
        result = fn()
        times[stage] = times.get(stage, 0.0) + time.perf_counter() - t
        times[stage + " (cpu)"] = times.get(stage + " (cpu)", 0.0) + time.process_time() - c
        _atomic_json(times, report_path)
        return result

    prompts_path = os.path.join(work, "prompts.json")
    if os.path.exists(prompts_path):
        with open(prompts_path, encoding="utf-8") as f:
            items = json.load(f)
    else:
        if prompts_file:
            with open(prompts_file, encoding="utf-8") as f:
                lines = [line.strip() for line in f if line.strip()]
            items = [{"id": f"p{i}", "kind": "file", "split": "held-out" if _held_out(i) else "train", "text": line}
                     for i, line in enumerate(lines)]
        else:
            topics = read_topics(topics_file)
            items = timed("prompts", lambda: write_prompts(model, tok, topics, settings, progress, eos, pad))
        _atomic_json(items, prompts_path)
    timed("answers", lambda: _generate_stage(model, tok, store, "answers", items, settings.max_new_tokens,
                                             settings.batch_size, True, progress, eos, pad))
    corpus = corpus_of(store, "train", model, {
        "data": "the model's own greedy answers (one stream per answer) "
                + (f"to the prompts of {os.path.basename(prompts_file)}" if prompts_file else
                   f"to prompts written from {os.path.basename(topics_file or TOPICS)} (chat and code topics): per "
                   f"topic {settings.questions} questions the model wrote itself and a direct request"),
        "model": model_name, "split": f"train (every {HELD_OUT_EVERY}th topic/prompt held out)",
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "max_new_tokens": settings.max_new_tokens, "seed": settings.seed})
    corpus.save(os.path.join(out, "corpus"))
    if not train:
        report = {"times": times, "prompts": len(items), "corpus": {"streams": corpus.streams, "tokens": len(corpus)}}
        _atomic_json(report, os.path.join(out, "report.json"))
        return report
    if settings.raw_tokens:
        raw = []
        for name in store.names("answers"):
            for m in store.meta(name):
                prefix = code_prefix(m["answer"])
                if prefix:
                    raw.append({"id": m["id"] + "-raw", "split": m["split"], "text": prefix})
        timed("raw", lambda: _generate_stage(model, tok, store, "raw", raw, settings.raw_tokens,
                                             settings.batch_size, False, progress, eos, pad))
    train = store.rows("train", os.path.join(work, "train.hidden.npy"))
    held = store.rows("held-out", os.path.join(work, "held-out.hidden.npy"))
    vocab = vocab_by_frequency(train.tokens, settings.vocab, always=eos)
    described = {
        "data": ("self-distillation: the model's own greedy answers, with the hidden states that produced them, "
                 + (f"to the prompts of {os.path.basename(prompts_file)}" if prompts_file else
                    f"to prompts written from {os.path.basename(topics_file or TOPICS)} (chat and code topics): "
                    f"per topic {settings.questions} questions the model wrote itself and a direct request")
                 + (", and raw continuations of the code in its answers" if settings.raw_tokens else "")),
        "model": model_name, "prompts": len(items),
        "prompts_sha256": digest_of(prompts_file) if prompts_file else digest_of(topics_file or TOPICS),
        "train_rows": len(train), "held_out_rows": len(held), "held_out": f"every {HELD_OUT_EVERY}th topic/prompt",
        "settings": asdict(settings), "seconds": {},
    }
    results = {}
    for kind in settings.kinds:
        torch.manual_seed(settings.seed)
        heads = DraftHeads.for_model(model, kind, settings.num_heads, vocab)
        losses = timed(f"train-{kind}", lambda heads=heads, kind=kind: train_heads(
            heads, train, model, settings.steps, settings.batch_rows, settings.lr, settings.seed,
            settings.reg_weight, progress, os.path.join(work, f"train-{kind}.pt"), settings.checkpoint_every))
        temps = calibrate(heads, held, model) if len(held) else [1.0] * settings.num_heads
        acc = evaluate(heads, held, model, settings.topk) if len(held) else {}
        heads.trained_on = dict(described, held_out_accuracy=acc, temperature=temps,
                              seconds={k: round(v, 1) for k, v in times.items()},
                              loss_curve=_thin(losses, 200))
        heads.save(os.path.join(out, kind))
        results[kind] = {"accuracy": acc, "temperature": temps, "final_loss": float(np.mean(losses[-50:]))
                         if losses else None, "losses": losses}
    best = max(results, key=lambda k: results[k]["accuracy"].get("chain", 0.0))
    with open(os.path.join(out, "default.txt"), "w", encoding="utf-8") as f:
        f.write(best + "\n")
    report = {"times": times, "results": {k: {kk: vv for kk, vv in v.items() if kk != "losses"}
                                          for k, v in results.items()},
              "losses": {k: v["losses"] for k, v in results.items()}, "default": best,
              "train_rows": len(train), "held_out_rows": len(held), "prompts": len(items),
              "vocab_coverage_train": float(np.isin(train.tokens, vocab).mean()) if len(train) else 0.0}
    _atomic_json(report, os.path.join(out, "report.json"))
    return report


def _thin(values: list[float], points: int) -> list[list[float]]:
    """[[step, mean loss], ...]: ``values`` averaged over ``points`` equal spans (a curve for the header)."""
    if not values:
        return []
    edges = np.linspace(0, len(values), min(points, len(values)) + 1).astype(int)
    return [[int(b), round(float(np.mean(values[a:b])), 4)] for a, b in zip(edges[:-1], edges[1:])]


def default_dtype() -> torch.dtype:
    """bfloat16 where the CPU multiplies it natively (AMX-BF16), else float32."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return torch.bfloat16 if "amx_bf16" in f.read() else torch.float32
    except OSError:
        return torch.float32


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The training run's options on ``p`` (``python -m lookahead train-heads`` and this module's own CLI)."""
    d = TrainSettings()
    p.add_argument("--out", required=True, help="output folder (heads, report, and work/ for resuming)")
    p.add_argument("--model", default=None, help="a local causal LM folder (default: the bundled SmolLM2-135M)")
    p.add_argument("--kind", type=parse_kinds, default="feature",
                   help=f"heads to train: one of {', '.join(KINDS)}, several joined by commas, 'both' (medusa,feature) "
                        "or 'all' (default: %(default)s)")
    p.add_argument("--prompts", default=None, help="a file of prompts, one per line (default: written by the model "
                   "from the package's topic list)")
    p.add_argument("--topics", default=None, help="a topics file ('chat: ...' / 'code: ...' lines; default: the "
                   "package's lookahead/data/topics.txt)")
    p.add_argument("--questions", type=int, default=d.questions,
                   help="questions the model writes per topic, beside the direct request (default: %(default)s)")
    p.add_argument("--heads", type=int, default=d.num_heads, help="K (default: %(default)s)")
    p.add_argument("--vocab", type=int, default=d.vocab, help="tokens the heads predict (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="answer length (default: %(default)s)")
    p.add_argument("--raw-tokens", type=int, default=d.raw_tokens,
                   help="raw code continuation length, 0: none (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="prompts per generate (default: %(default)s)")
    p.add_argument("--steps", type=int, default=d.steps, help="training steps per kind (default: %(default)s)")
    p.add_argument("--batch-rows", type=int, default=d.batch_rows, help="rows per step (default: %(default)s)")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed (default: %(default)s)")
    _add_run_arguments(p)
    return p


def add_corpus_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``python -m lookahead build-corpus``: the answer-writing stages of a training run."""
    d = TrainSettings()
    p.add_argument("--out", required=True, help="output folder (corpus/, report, and work/ for resuming)")
    p.add_argument("--model", default=None, help="a local causal LM folder (default: the bundled SmolLM2-135M)")
    p.add_argument("--prompts", default=None, help="a file of prompts, one per line (default: written by the model "
                   "from the package's topic list)")
    p.add_argument("--topics", default=None, help="a topics file ('chat: ...' / 'code: ...' lines; default: the "
                   "package's lookahead/data/topics.txt)")
    p.add_argument("--questions", type=int, default=CORPUS_QUESTIONS,
                   help="questions the model writes per topic, beside the direct request (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="answer length (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="prompts per generate (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed (default: %(default)s)")
    p.add_argument("--no-install", action="store_true",
                   help="only write OUT/corpus, do not also install it in the user cache, where LookaheadDecoder() "
                        "finds it for this model (corpus=\"auto\") (default: installed)")
    _add_run_arguments(p)
    return p


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--device", default="auto", help="cpu, cuda, ...; auto: cuda if present (default: %(default)s)")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                   help="the model's dtype; auto: bfloat16 on a CPU with AMX-BF16 or on CUDA, else float32 "
                        "(default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (default: off, bars are shown)")


CORPUS_QUESTIONS = 2
"""``build-corpus``'s questions per topic: more of the model's writing drafts more (with 2, about 100k tokens
for the bundled model and the package's topics, in about 10 minutes on a 2-core CPU with AMX-BF16)."""


def parse_kinds(text: str) -> tuple[str, ...]:
    """The kinds ``--kind`` names: ``"feature"``, ``"medusa,context"``, ``"both"`` (Medusa and feature) or ``"all"``.

    Example: ``parse_kinds("context,feature")`` -> ``("context", "feature")``."""
    if text == "all":
        return tuple(KINDS)
    if text == "both":
        return ("medusa", "feature")
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in KINDS]
    if not kinds or bad:
        raise argparse.ArgumentTypeError(f"--kind {text!r}: expected kinds among {', '.join(KINDS)}, 'both' or 'all'")
    return tuple(dict.fromkeys(kinds))


def build_parser() -> argparse.ArgumentParser:
    return add_arguments(argparse.ArgumentParser(prog="python -m lookahead train-heads", description=__doc__,
                                                 formatter_class=argparse.RawDescriptionHelpFormatter))


def main(argv: list[str] | None = None) -> int:
    return run_args(build_parser().parse_args(argv))


def run_args(args: argparse.Namespace) -> int:
    """A training run from parsed :func:`add_arguments` options; prints the held-out accuracy."""
    kinds = parse_kinds(args.kind) if isinstance(args.kind, str) else args.kind
    settings = TrainSettings(kinds=kinds, num_heads=args.heads,
                             vocab=args.vocab, questions=args.questions, max_new_tokens=args.max_new_tokens, raw_tokens=args.raw_tokens,
                             batch_size=args.batch_size, steps=args.steps, batch_rows=args.batch_rows, lr=args.lr,
                             seed=args.seed)
    model, tok, name = _load(args)
    t = time.perf_counter()
    report = run(args.out, model, tok, settings, args.prompts, args.topics, not args.no_progress, name)
    for kind, r in report["results"].items():
        acc = r["accuracy"]
        print(f"{kind}: held-out top-1 {acc.get('top1')}, top-{settings.topk} {acc.get(f'top{settings.topk}')}, "
              f"top-1 chain {acc.get('chain')}")
    print(f"wrote {args.out} (default: {report['default']}) in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    return 0


def _load(args: argparse.Namespace):
    """The model, tokenizer and name ``--model``, ``--device``, ``--dtype`` and ``--threads`` ask for."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(args.dtype)
    if dtype is None:
        dtype = torch.bfloat16 if device.startswith("cuda") else default_dtype()
    from .models import load_model

    print(f"loading {args.model or 'the bundled SmolLM2-135M-Instruct'} ({str(dtype).replace('torch.', '')}, "
          f"{device}) ...", file=sys.stderr, flush=True)
    model, tok = load_model(args.model, dtype=dtype, device=device)
    return model, tok, args.model or "SmolLM2-135M-Instruct (bundled)"


def run_corpus_args(args: argparse.Namespace) -> int:
    """``build-corpus`` from parsed :func:`add_corpus_arguments` options: the model's answers as ``OUT/corpus``."""
    settings = TrainSettings(questions=args.questions, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                             seed=args.seed)
    model, tok, name = _load(args)
    t = time.perf_counter()
    report = run(args.out, model, tok, settings, args.prompts, args.topics, not args.no_progress, name, train=False)
    c = report["corpus"]
    written = os.path.join(args.out, "corpus")
    print(f"wrote {written}: {c['streams']} answers, {c['tokens']} tokens, in {time.perf_counter() - t:.0f} s; use it "
          "as LookaheadDecoder(corpus=DraftCorpus.load(...))", file=sys.stderr)
    if not args.no_install:
        from .corpus import DraftCorpus
        from .user_cache import persist_enabled

        if persist_enabled():
            folder = DraftCorpus.load(written, model=model).install()
            print(f"installed it in {folder}: LookaheadDecoder() drafts from it for this model with no argument "
                  "(--no-install: do not)", file=sys.stderr)
        else:
            print("not installed: the user cache is turned off (LOOKAHEAD_PERSIST)", file=sys.stderr)
    return 0


def digest_of(path: str) -> str:
    """sha256 of a file (to record which prompts file trained a set of heads)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


if __name__ == "__main__":
    sys.exit(main())
