"""Training draft heads by self-distillation: ``python -m lookahead train-heads --out DIR``.

The frozen model answers prompts greedily; each answer token's final hidden state is stored with the tokens that
followed it. Medusa head ``k`` learns the token ``k`` after the one its row produced; the feature and context heads
learn the next hidden state and token, unrolled over their own predictions for ``K`` levels.

Stages, each resumable (kept under ``DIR/work``; a rerun continues where one stopped):

1. prompts: one per line of ``--prompts FILE``, or from ``lookahead/data/topics.txt`` (chat and code topics): per
   topic ``--questions`` questions the model writes itself (sampled, seeded) and one direct request. Every tenth
   topic (or prompt) is held out.
2. answers: greedy answers (``--max-new-tokens``) in batches, their hidden states stored in float16 shards (read
   memory-mapped); the training split's answers are also written as a draft corpus, ``DIR/corpus``.
3. raw code: the answers' code blocks, cut after the first function's docstring, continued as raw text.
4. vocabulary: the ``--vocab`` most frequent tokens of the training split's answers.
5. training (AdamW, cosine schedule, checkpoints), one temperature per head fitted on the held-out split, and the
   held-out report (per-head top-1 / top-k accuracy; wall and CPU seconds and peak memory per stage).

Writes ``DIR/<kind>/`` per trained kind and ``DIR/default.txt`` naming the kind with the longest held-out top-1
chain (``DraftHeads.load(DIR)`` loads that one).
"""

from __future__ import annotations

import argparse
import functools
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

from .context import unrolled_features
from .model import KINDS, DraftHeads, check_ints, invalid

TOPICS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "topics.txt")
HELD_OUT_EVERY = 10
"""Every this-many-th topic (or prompt, with ``--prompts``) is held out."""
CORPUS_QUESTIONS = 2
"""``build-corpus``'s questions per topic (more of the model's own writing drafts more)."""


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
    batch_size: int = 32
    steps: int = 1200
    batch_rows: int = 256
    lr: float = 1e-3
    reg_weight: float = 0.5
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
        return cls(np.concatenate([h for h, _ in sequences]),
                   np.concatenate([t for _, t in sequences]).astype(np.int64),
                   sequence_ends([len(t) for _, t in sequences]))


def sequence_ends(lengths: Sequence[int]) -> np.ndarray:
    """int64[sum(lengths)]: per row, one past its sequence's last row. Example: ``[2, 3]`` -> ``[2, 2, 5, 5, 5]``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return np.repeat(np.cumsum(lengths), lengths)


def sequence_bounds(rows: Rows) -> tuple[np.ndarray, np.ndarray]:
    """(starts, lengths) int64[S] of the sequences of ``rows``. Example: ends ``[2, 2, 5, 5, 5]`` -> ``[0, 2]``,
    ``[2, 3]``."""
    ends = np.unique(rows.ends)
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    return starts, (ends - starts).astype(np.int64)


def generate_rows(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, max_new_tokens: int,
                  eos: Sequence[int], pad_token_id: int, **sample) -> list[tuple[np.ndarray, np.ndarray]]:
    """Greedy (with ``sample`` kwargs: sampled) continuations of a left-padded batch ``input_ids`` long[B, L]: per
    row ``(hidden float16[T, H], tokens int64[T])``, cut after the first end-of-sequence token. ``hidden[i]`` is the
    final hidden state that produced token ``i``: what the decoder hands ``HeadsSource.observe_hidden``."""
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


def left_padded(tokenizer, texts: Sequence[str], chat: bool, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, attention mask) long[B, L] of ``texts``, left-padded; ``chat``: through the chat template."""
    special = not (chat and getattr(tokenizer, "chat_template", None))
    if not special:
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                               tokenize=False) for t in texts]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        enc = tokenizer(list(texts), return_tensors="pt", padding=True, add_special_tokens=special)
    finally:
        tokenizer.padding_side = side
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


def read_topics(path: str | None = None) -> list[tuple[str, str]]:
    """(``"chat"`` or ``"code"``, topic) pairs of a topics file (``kind: topic`` per line, ``#`` comments)."""
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


ASK = {"code": "Write a request that a user could send to a coding assistant, asking for {}. Write only the request, "
               "in one or two sentences.",
       "chat": "Write a question that a curious person could ask an assistant about {}. Write only the question."}
"""What the model is asked, per topic kind, to write a prompt about a topic itself."""
DIRECT = {"code": "Write {}. Give it a docstring and show a short example of its use.", "chat": "Tell me about {}."}
"""The prompt made from the topic line itself."""


def clean_question(text: str) -> str | None:
    """The model-written prompt, or None when unusable (too short, or code instead of a request)."""
    text = text.strip().strip('"').strip()
    return None if "```" in text or "def " in text or len(text) < 12 else text[:400]


def code_prefix(answer: str, max_lines: int = 12) -> str | None:
    """A raw code-completion prompt from an answer's first code block: its lines up to the end of the first
    function's docstring (HumanEval's shape), else its first three lines; None without a code block of 3+ lines.

    Example: a fenced ``def f(x):`` / ``    \"\"\"Double x.\"\"\"`` / ``    return 2 * x`` gives its first two lines."""
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


def positions_in(vocab_ids: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """int64[...]: each token's position in ``vocab_ids``, -100 (ignored by the loss) where absent."""
    lookup = np.full(max(int(vocab_ids.max()), int(tokens.max(initial=0))) + 1, -100, np.int64)
    lookup[vocab_ids] = np.arange(len(vocab_ids))
    return lookup[tokens]


class Batch:
    """What a batch trains or is scored on, per query ``n`` (a row ``idx[n]``) and level ``k = 1..K``: ``target``
    int64[N, K] (vocabulary positions, -100: ignored), ``valid`` bool[N, K], :attr:`truth` float32[N, K, H] (the
    true feature level ``k`` should match); ``hidden`` float32[N, H] and ``inputs`` int64[N, K], the token level
    ``k`` is fed (Medusa, feature). A context head's batch (:meth:`answers`) holds whole answers instead: ``hidden``
    float32[S, T, H], ``tokens`` int64[S, T] (zero past an answer's end), query ``positions`` int64[S, P] below each
    answer's length minus one, ``N = S * P``."""

    def __init__(self, rows: Rows, idx: np.ndarray, vocab_ids: np.ndarray, levels: int):
        at = idx[:, None] + np.arange(1, levels + 1)[None, :]  # [N, K]: the row whose token level k predicts
        self.valid = at < rows.ends[idx][:, None]
        self._rows, self._truth_at = rows, np.where(self.valid, at, idx[:, None])
        self.target = np.where(self.valid, positions_in(vocab_ids, rows.tokens[self._truth_at]), -100)
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

    @property
    def truth(self) -> np.ndarray:
        return np.asarray(self._rows.hidden[self._truth_at], dtype=np.float32)


def sample_answers(rows: Rows, bounds: tuple[np.ndarray, np.ndarray], rng: np.random.Generator, batch_rows: int,
                   vocab_ids: np.ndarray, levels: int, per_answer: int = 32) -> Batch:
    """``batch_rows // per_answer`` answers, drawn in proportion to their rows, with ``per_answer`` query positions
    each (drawn with replacement)."""
    starts, lengths = bounds
    usable = np.nonzero(lengths >= 2)[0]
    weights = (lengths[usable] - 1) / (lengths[usable] - 1).sum()
    chosen = rng.choice(usable, size=max(1, batch_rows // per_answer), p=weights)
    positions = rng.integers(0, lengths[chosen, None] - 1, (len(chosen), per_answer))
    return Batch.answers(rows, starts[chosen], lengths[chosen], positions, vocab_ids, levels)


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
                checkpoint_every: int = 200, weight_decay: float = 0.0, until: int | None = None) -> list[float]:
    """Train ``heads`` in place on ``rows`` for ``steps`` AdamW steps (warm-up, then cosine); the loss of every
    step. Batch ``i`` is drawn with seed ``(seed, i)``, so a run resumed from ``checkpoint`` (written every
    ``checkpoint_every`` steps) trains exactly as one that never stopped. ``until``: stop (checkpointed) there."""
    weight, bias, embed = frozen_parts(model, heads.vocab_ids.numpy())
    usable = np.nonzero(np.arange(len(rows)) + 1 < rows.ends)[0]  # rows with at least one target
    if not len(usable):
        raise ValueError("no training rows: every sequence has a single token")
    heads.train()
    params = [p for p in heads.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
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
    vocab_ids = heads.vocab_ids.numpy()
    for step in bar:
        rng = np.random.default_rng((seed, step))
        if bounds is not None:
            b = sample_answers(rows, bounds, rng, batch_rows, vocab_ids, heads.num_heads)
        else:
            b = Batch(rows, usable[rng.integers(0, len(usable), batch_rows)], vocab_ids, heads.num_heads)
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
    K = heads.num_heads
    usable = np.nonzero(np.arange(len(rows)) + 1 < rows.ends)[0][:max_rows]
    hit1, hitk, count, covered = np.zeros(K), np.zeros(K), np.zeros(K), np.zeros(K)
    temps = [float(t) for t in temperatures]
    nll = np.zeros((K, len(temps)))
    chain_total, chain_rows = 0.0, 0
    heads.eval()
    for logits, target, valid in scored_batches(heads, rows, usable, weight, bias, embed, batch):
        top = logits.topk(min(topk, logits.shape[-1]), -1).indices  # [B, K, topk]
        right1, rightk = (top[..., 0] == target).numpy(), (top == target[..., None]).any(-1).numpy()
        hit1 += (right1 & valid).sum(0)
        hitk += (rightk & valid).sum(0)
        count += valid.sum(0)
        covered += ((target.numpy() >= 0) & valid).sum(0)
        full = valid.all(1)  # rows whose K next tokens all exist: the chain is measured on them
        chain_total += float(np.cumprod(right1[full], 1).sum())
        chain_rows += int(full.sum())
        for j, temp in enumerate(temps):
            logp = torch.log_softmax(logits / temp, -1).gather(-1, target.clamp(min=0)[..., None])[..., 0]  # [B, K]
            nll[:, j] -= (logp * (target >= 0)).sum(0).numpy()
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


def _held_out(key: int) -> bool:
    return key % HELD_OUT_EVERY == HELD_OUT_EVERY - 1


def _peak_mib() -> float:
    """The process's peak resident memory in MiB (Linux), plus the peak CUDA allocation when CUDA is in use."""
    import resource

    cuda = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_initialized() else 0.0
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 + cuda, 1)


class ShardStore:
    """Generated rows on disk, per shard: ``NAME.hidden.npy`` (float16 [N, H]), ``NAME.tokens.npy`` (int64[N]) and
    ``NAME.json`` (per sequence: length, prompt id, split, texts), written once, its JSON last, so a rerun skips the
    shards that exist."""

    def __init__(self, folder: str):
        self.folder = folder
        os.makedirs(folder, exist_ok=True)

    def has(self, name: str) -> bool:
        return os.path.exists(os.path.join(self.folder, name + ".json"))

    def write(self, name: str, sequences: list[tuple[np.ndarray, np.ndarray]], meta: list[dict]) -> None:
        for suffix, arr in (("hidden", np.concatenate([h for h, _ in sequences]).astype(np.float16)),
                            ("tokens", np.concatenate([t for _, t in sequences]).astype(np.int64))):
            _atomic(functools.partial(np.save, arr=arr), os.path.join(self.folder, f"{name}.{suffix}.npy"))
        _atomic_json([dict(m, length=int(len(t))) for m, (_, t) in zip(meta, sequences)],
                     os.path.join(self.folder, name + ".json"))

    def names(self, prefix: str = "") -> list[str]:
        return sorted(f[:-5] for f in os.listdir(self.folder) if f.endswith(".json") and f.startswith(prefix))

    def meta(self, name: str) -> list[dict]:
        with open(os.path.join(self.folder, name + ".json"), encoding="utf-8") as f:
            return json.load(f)

    def sequences(self, prefix: str, split: str, arrays: tuple[str, ...] = ("hidden", "tokens")):
        """(meta, [memory-mapped rows of each of ``arrays``]) of every ``split`` sequence in shards ``prefix...``."""
        for name in self.names(prefix):
            meta = self.meta(name)
            opened = [np.load(os.path.join(self.folder, f"{name}.{a}.npy"), mmap_mode="r") for a in arrays]
            ends = np.cumsum([m["length"] for m in meta])
            for m, end in zip(meta, ends.tolist()):
                if m["split"] == split:
                    yield m, [x[end - m["length"]: end] for x in opened]

    def rows(self, split: str, out_path: str) -> Rows:
        """The rows of every shard's ``split`` sequences, merged into one memory-mapped file ``out_path``."""
        chosen = [pair for _, pair in self.sequences("", split)]
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


def _generate_stage(model, tok, store: ShardStore, prefix: str, items: list[dict], max_new_tokens: int,
                    batch_size: int, chat: bool, progress: bool, eos: list[int], pad: int) -> None:
    """Greedy answers of ``items`` (dicts with ``text``, ``id``, ``split``) into shards ``prefix-NNNN``."""
    order = sorted(range(len(items)), key=lambda i: len(items[i]["text"]))  # similar lengths pad less
    batches = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    for b, chosen in _bar(list(enumerate(batches)), progress, f"{prefix}: generating"):
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
    """Per topic, ``settings.questions`` questions the model writes itself (sampled, seeded) and the direct request;
    a topic's prompts share its split."""
    torch.manual_seed(settings.seed)
    items = [{"id": f"t{n}-d", "topic": topic, "kind": kind, "split": "held-out" if _held_out(n) else "train",
              "text": DIRECT[kind].format(topic)} for n, (kind, topic) in enumerate(topics)]
    asks = [(n, j) for n in range(len(topics)) for j in range(settings.questions)]
    for lo in _bar(range(0, len(asks), settings.batch_size), progress, "prompts: writing"):
        chunk = asks[lo: lo + settings.batch_size]
        ids, mask = left_padded(tok, [ASK[topics[n][0]].format(topics[n][1]) for n, _ in chunk], True, model.device)
        seqs = generate_rows(model, ids, mask, settings.question_tokens, eos, pad, temperature=0.8, top_p=0.95)
        for (n, j), (_, t) in zip(chunk, seqs):
            written = clean_question(tok.decode(t, skip_special_tokens=True))
            if written:
                items.append({**items[n], "id": f"t{n}-q{j}", "text": written})
    return items


def corpus_of(store: ShardStore, split: str, model, described: dict):
    """The answers (shards ``answers-*``) of ``split`` as a ``DraftCorpus`` of ``model``, one stream per answer."""
    from ..corpus import DraftCorpus

    streams = [np.array(tokens) for _, (tokens,) in store.sequences("answers", split, ("tokens",))]
    return DraftCorpus.from_streams(streams, model, described)


def run(out: str, model, tok, settings: TrainSettings, prompts_file: str | None = None,
        topics_file: str | None = None, progress: bool = True, model_name: str = "", train: bool = True) -> dict:
    """Every stage (see the module docstring), resuming from ``out/work``; the report. Writes the training split's
    answers as ``out/corpus``; ``train=False`` stops there (no heads)."""
    work = os.path.join(out, "work")
    os.makedirs(work, exist_ok=True)
    store = ShardStore(os.path.join(work, "shards"))
    eos_ids = model.generation_config.eos_token_id
    eos = [int(e) for e in (eos_ids if isinstance(eos_ids, (list, tuple)) else [eos_ids]) if e is not None]
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
    times_path = os.path.join(work, "times.json")
    times: dict[str, float] = {}
    if os.path.exists(times_path):
        with open(times_path, encoding="utf-8") as f:
            times = json.load(f)

    def timed(stage: str, fn):  # wall seconds, CPU seconds (what other work cannot inflate), peak memory so far
        t, c = time.perf_counter(), time.process_time()
        result = fn()
        times[stage] = times.get(stage, 0.0) + time.perf_counter() - t
        times[stage + " (cpu)"] = times.get(stage + " (cpu)", 0.0) + time.process_time() - c
        times[stage + " (peak MiB)"] = _peak_mib()
        _atomic_json(times, times_path)
        return result

    prompts_path = os.path.join(work, "prompts.json")
    if os.path.exists(prompts_path):
        with open(prompts_path, encoding="utf-8") as f:
            items = json.load(f)
    elif prompts_file:
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
    prompts = (f"to the prompts of {os.path.basename(prompts_file)}" if prompts_file else
               f"to prompts written from {os.path.basename(topics_file or TOPICS)} (chat and code topics): per topic "
               f"{settings.questions} questions the model wrote itself and a direct request")
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    corpus = corpus_of(store, "train", model, {
        "data": f"the model's own greedy answers (one stream per answer) {prompts}", "model": model_name,
        "split": f"train (every {HELD_OUT_EVERY}th topic/prompt held out)", "dtype": dtype,
        "max_new_tokens": settings.max_new_tokens, "seed": settings.seed})
    corpus.save(os.path.join(out, "corpus"))
    if not train:
        report = {"times": times, "prompts": len(items), "corpus": {"streams": corpus.streams, "tokens": len(corpus)}}
        _atomic_json(report, os.path.join(out, "report.json"))
        return report
    if settings.raw_tokens:
        raw = [{"id": m["id"] + "-raw", "split": m["split"], "text": code_prefix(m["answer"])}
               for name in store.names("answers") for m in store.meta(name)]
        raw = [r for r in raw if r["text"]]
        timed("raw", lambda: _generate_stage(model, tok, store, "raw", raw, settings.raw_tokens, settings.batch_size,
                                             False, progress, eos, pad))
    train_rows = store.rows("train", os.path.join(work, "train.hidden.npy"))
    held = store.rows("held-out", os.path.join(work, "held-out.hidden.npy"))
    vocab = vocab_by_frequency(train_rows.tokens, settings.vocab, always=eos)
    described = {
        "data": f"self-distillation: the model's own greedy answers, with the hidden states that produced them, "
                f"{prompts}" + (", and raw continuations of the code in its answers" if settings.raw_tokens else ""),
        "model": model_name, "prompts": len(items), "prompts_sha256": digest_of(prompts_file or topics_file or TOPICS),
        "train_rows": len(train_rows), "held_out_rows": len(held), "held_out": f"every {HELD_OUT_EVERY}th topic/prompt",
        "settings": asdict(settings)}
    results, curves = {}, {}
    for kind in settings.kinds:
        torch.manual_seed(settings.seed)
        heads = DraftHeads.for_model(model, kind, settings.num_heads, vocab)
        losses = timed(f"train-{kind}", lambda heads=heads, kind=kind: train_heads(
            heads, train_rows, model, settings.steps, settings.batch_rows, settings.lr, settings.seed,
            settings.reg_weight, progress, os.path.join(work, f"train-{kind}.pt"), settings.checkpoint_every))
        temps = calibrate(heads, held, model) if len(held) else [1.0] * settings.num_heads
        acc = evaluate(heads, held, model, settings.topk) if len(held) else {}
        heads.trained_on = dict(described, held_out_accuracy=acc, temperature=temps, loss_curve=_thin(losses, 200),
                                times={k: round(v, 1) for k, v in times.items()})
        heads.save(os.path.join(out, kind))
        results[kind] = {"accuracy": acc, "temperature": temps,
                         "final_loss": float(np.mean(losses[-50:])) if losses else None}
        curves[kind] = losses
    best = max(results, key=lambda k: results[k]["accuracy"].get("chain", 0.0))
    with open(os.path.join(out, "default.txt"), "w", encoding="utf-8") as f:
        f.write(best + "\n")
    report = {"times": times, "default": best, "train_rows": len(train_rows), "held_out_rows": len(held),
              "results": results, "losses": curves, "prompts": len(items),
              "vocab_coverage_train": float(np.isin(train_rows.tokens, vocab).mean()) if len(train_rows) else 0.0}
    _atomic_json(report, os.path.join(out, "report.json"))
    return report


def _thin(values: list[float], points: int) -> list[list[float]]:
    """[[step, mean loss], ...]: ``values`` averaged over ``points`` equal spans (a curve for the header)."""
    if not values:
        return []
    edges = np.linspace(0, len(values), min(points, len(values)) + 1).astype(int)
    return [[int(b), round(float(np.mean(values[a:b])), 4)] for a, b in zip(edges[:-1], edges[1:])]


def digest_of(path: str) -> str:
    """sha256 of a file (which prompts or topics trained a set of heads)."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def parse_kinds(text: str) -> tuple[str, ...]:
    """The kinds ``--kind`` names: one, several joined by commas, ``"both"`` (Medusa and feature) or ``"all"``.

    Example: ``parse_kinds("context,feature")`` -> ``("context", "feature")``."""
    if text in ("all", "both"):
        return KINDS if text == "all" else ("medusa", "feature")
    kinds = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    if not kinds or any(k not in KINDS for k in kinds):
        raise argparse.ArgumentTypeError(f"--kind {text!r}: expected kinds among {', '.join(KINDS)}, 'both' or 'all'")
    return kinds


def _add_data_arguments(p: argparse.ArgumentParser, what: str, questions: int) -> None:
    d = TrainSettings()
    p.add_argument("--out", required=True, help=f"output folder ({what}, report, and work/ for resuming)")
    p.add_argument("--model", default=None, help="a local causal LM folder (default: the bundled SmolLM2-135M)")
    p.add_argument("--prompts", default=None, help="a file of prompts, one per line (default: written by the model "
                   "from the package's topic list)")
    p.add_argument("--topics", default=None, help="a topics file ('chat: ...' / 'code: ...' lines; default: the "
                   "package's lookahead/data/topics.txt)")
    p.add_argument("--questions", type=int, default=questions,
                   help="questions the model writes per topic, beside the direct request (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="answer length (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="prompts per generate (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--device", default="auto", help="cpu, cuda, ...; auto: cuda if present (default: %(default)s)")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                   help="the model's dtype; auto: bfloat16 on a CPU with AMX-BF16 or on CUDA, else float32 "
                        "(default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (default: off, bars are shown)")


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The training run's options on ``p`` (``python -m lookahead train-heads``)."""
    d = TrainSettings()
    _add_data_arguments(p, "heads, corpus/", d.questions)
    p.add_argument("--kind", type=parse_kinds, default="feature",
                   help=f"heads to train: one of {', '.join(KINDS)}, several joined by commas, 'both' (medusa,feature) "
                        "or 'all' (default: %(default)s)")
    p.add_argument("--heads", type=int, default=d.num_heads, help="K (default: %(default)s)")
    p.add_argument("--vocab", type=int, default=d.vocab, help="tokens the heads predict (default: %(default)s)")
    p.add_argument("--raw-tokens", type=int, default=d.raw_tokens,
                   help="raw code continuation length, 0: none (default: %(default)s)")
    p.add_argument("--steps", type=int, default=d.steps, help="training steps per kind (default: %(default)s)")
    p.add_argument("--batch-rows", type=int, default=d.batch_rows, help="rows per step (default: %(default)s)")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (default: %(default)s)")
    return p


def add_corpus_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``python -m lookahead build-corpus``: the answer-writing stages of a training run."""
    _add_data_arguments(p, "corpus/", CORPUS_QUESTIONS)
    p.add_argument("--no-install", action="store_true",
                   help="only write OUT/corpus, do not also install it in the user cache, where LookaheadDecoder() "
                        "finds it for this model (corpus=\"auto\") (default: installed)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m lookahead.heads.train``: as ``python -m lookahead train-heads``."""
    parser = argparse.ArgumentParser(prog="python -m lookahead train-heads", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    return run_args(add_arguments(parser).parse_args(argv))


def run_args(args: argparse.Namespace) -> int:
    """A training run from parsed :func:`add_arguments` options; prints the held-out accuracy."""
    kinds = parse_kinds(args.kind) if isinstance(args.kind, str) else args.kind
    settings = TrainSettings(kinds=kinds, num_heads=args.heads, vocab=args.vocab, questions=args.questions,
                             max_new_tokens=args.max_new_tokens, raw_tokens=args.raw_tokens,
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
        from ..corpus import DraftCorpus
        from ..user_cache import persist_enabled

        if persist_enabled():
            folder = DraftCorpus.load(written, model=model).install()
            print(f"installed it in {folder}: LookaheadDecoder() drafts from it for this model with no argument "
                  "(--no-install: do not)", file=sys.stderr)
        else:
            print("not installed: the user cache is turned off (LOOKAHEAD_PERSIST)", file=sys.stderr)
    return 0


def default_dtype() -> torch.dtype:
    """bfloat16 where the CPU multiplies it natively (AMX-BF16), else float32."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return torch.bfloat16 if "amx_bf16" in f.read() else torch.float32
    except OSError:
        return torch.float32


def _load(args: argparse.Namespace):
    """The model, tokenizer and name that ``--model``, ``--device``, ``--dtype`` and ``--threads`` ask for."""
    from ..tools.console import set_threads
    from ..tools.models import load_model

    set_threads(args.threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(args.dtype)
    if dtype is None:
        dtype = torch.bfloat16 if device.startswith("cuda") else default_dtype()
    print(f"loading {args.model or 'the bundled SmolLM2-135M-Instruct'} ({str(dtype).replace('torch.', '')}, "
          f"{device}) ...", file=sys.stderr, flush=True)
    model, tok = load_model(args.model, dtype=dtype, device=device)
    return model, tok, args.model or "SmolLM2-135M-Instruct (bundled)"


if __name__ == "__main__":
    sys.exit(main())
