"""The context head: the feature head's map with one causal attention layer over the answer's earlier positions.

Position ``i``'s input is ``z_i = fc([n(f_i), n(e(t_i))])`` (``f_i``: the final hidden state that produced token
``t_i``; ``n``: RMS norm; ``e``: the model's input embedding); the next feature is ``y + down(silu(up(y)))``, ``y = z +
W_o attention(q(z) -> the earlier inputs' keys and values)`` (rotary positions). Level ``k`` feeds the predicted
feature back at position ``p + k - 1``, attending to the true ``z_0..z_p`` and to its own chain ``z^2..z^k``."""

from __future__ import annotations

import math

import torch
from torch import nn

ROPE_BASE, HEAD_DIM = 10000.0, 64  # hidden size H gets about H // 64 attention heads
CACHE_WINDOW = 1024  # positions the drafting cache keeps (a sliding window over the answer)


def attention_heads(hidden_size: int) -> int:
    """Attention heads of a context head over ``hidden_size``: the most up to ``H // 64`` that divide it."""
    n = max(1, hidden_size // HEAD_DIM)
    while hidden_size % n:
        n -= 1
    return n


def rms(x: torch.Tensor) -> torch.Tensor:
    """RMS normalisation over the last axis, no weight."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (Llama's halves) of ``x`` float[..., nh, hd] at positions ``pos`` long[...]."""
    half = x.shape[-1] // 2
    freq = ROPE_BASE ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)  # [hd/2]
    angle = pos.to(torch.float32)[..., None] * freq  # [..., hd/2]
    cos, sin = angle.cos()[..., None, :], angle.sin()[..., None, :]  # [..., 1, hd/2]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


class ContextLayer(nn.Module):
    """The trainable part: ``fc`` [2H -> H], attention ``q``, ``k``, ``v``, ``o`` [H -> H] and the residual SiLU
    MLP ``up`` [H -> ffn H], ``down`` (``o`` and ``down`` zero-initialised: an untrained layer maps ``z`` to itself)."""

    def __init__(self, hidden_size: int, ffn: int = 2, heads: int | None = None, dropout: float = 0.0):
        super().__init__()
        h = hidden_size
        self.heads = heads or attention_heads(h)
        if h % self.heads:
            raise ValueError(f"context head: {self.heads} attention heads do not divide hidden size {h}")
        self.fc = nn.Linear(2 * h, h)
        self.q, self.k, self.v, self.o = (nn.Linear(h, h, bias=False) for _ in range(4))
        self.up, self.down = nn.Linear(h, ffn * h), nn.Linear(ffn * h, h)
        for p in (self.o.weight, self.down.weight, self.down.bias):
            nn.init.zeros_(p)
        self.drop = nn.Dropout(dropout)

    def inputs(self, feature: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """float[..., H]: ``z`` of features and their tokens' embeddings (both float[..., H])."""
        return self.fc(self.drop(torch.cat([rms(feature), rms(embedding)], -1)))

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(*x.shape[:-1], self.heads, x.shape[-1] // self.heads)

    def keys(self, z: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values) float[..., nh, hd] of inputs ``z`` float[..., H] at positions ``pos`` long[...]."""
        x = rms(z)
        return rope(self._split(self.k(x)), pos), self._split(self.v(x))

    def step(self, z: torch.Tensor, pos: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
             mask: torch.Tensor | None = None, chain: tuple | None = None) -> torch.Tensor:
        """float[B, Q, H]: the next feature of inputs ``z`` float[B, Q, H] at ``pos`` long[B, Q], attending to
        the shared ``keys``, ``values`` [B, T, nh, hd] where ``mask`` bool[B, Q, T] (None: all) and to each
        query's own ``chain`` (``(keys, values)`` [B, Q, c, nh, hd], or None)."""
        q = rope(self._split(self.q(rms(z))), pos)
        scale = 1.0 / math.sqrt(q.shape[-1])
        scores = torch.einsum("bqhd,bthd->bqht", q, keys) * scale  # [B, Q, nh, T]
        if mask is not None:
            scores = scores.masked_fill(~mask[:, :, None, :], float("-inf"))
        if chain is None or chain[0].shape[2] == 0:
            attended = torch.einsum("bqht,bthd->bqhd", torch.softmax(scores, -1), values)
        else:
            own = torch.einsum("bqhd,bqchd->bqhc", q, chain[0]) * scale  # [B, Q, nh, c]
            weights = torch.softmax(torch.cat([scores, own], -1), -1)
            t = keys.shape[1]
            attended = (torch.einsum("bqht,bthd->bqhd", weights[..., :t], values)
                        + torch.einsum("bqhc,bqchd->bqhd", weights[..., t:], chain[1]))
        y = z + self.o(attended.flatten(-2))
        return y + self.down(self.drop(nn.functional.silu(self.up(y))))

    def chain_step(self, feature: torch.Tensor, embedding: torch.Tensor, pos: torch.Tensor, keys: torch.Tensor,
                   values: torch.Tensor, mask: torch.Tensor | None, chain: tuple | None) -> tuple:
        """Level ``k >= 2``: (the next feature, ``chain`` grown by this level's keys and values) from the previous
        level's ``feature`` float[B, Q, H] and its token's ``embedding``, at ``pos``."""
        z = self.inputs(feature, embedding)
        k, v = (x[:, :, None] for x in self.keys(z, pos))
        chain = (k, v) if chain is None else (torch.cat([chain[0], k], 2), torch.cat([chain[1], v], 2))
        return self.step(z, pos, keys, values, mask, chain), chain


def unrolled_features(layer: ContextLayer, hidden: torch.Tensor, embedded: torch.Tensor, positions: torch.Tensor,
                      levels: int) -> torch.Tensor:
    """float[S, P, levels, H]: at query ``positions`` long[S, P] of padded answers (true features ``hidden`` and
    ``embedded`` tokens float[S, T, H]), level ``k``'s feature, fed the true token ``t_{p+k-1}`` (clamped past the
    end), which should predict ``t_{p+k}``."""
    s, t, _ = hidden.shape
    z = layer.inputs(hidden, embedded)  # [S, T, H]
    keys, values = layer.keys(z, torch.arange(t, device=z.device).expand(s, t))  # [S, T, nh, hd]
    rows = torch.arange(s, device=z.device)[:, None]
    mask = torch.arange(t, device=z.device)[None, None, :] <= positions[:, :, None]  # [S, P, T]
    out, chain = [layer.step(z[rows, positions], positions, keys, values, mask)], None
    for level in range(2, levels + 1):
        pos = positions + level - 1
        feature, chain = layer.chain_step(out[-1], embedded[rows, pos.clamp(max=t - 1)], pos, keys, values, mask,
                                          chain)
        out.append(feature)
    return torch.stack(out, 2)


class ContextCache:
    """Keys and values of one answer's last ``window`` true positions, for drafting: :meth:`observe` takes a step's
    accepted rows, :meth:`learn` pairs them with the emitted tokens, :meth:`flush` (before a draft) appends them.
    ``last_input``: the newest position's ``z`` (the level-1 query); ``count``: positions appended so far."""

    def __init__(self, window: int = CACHE_WINDOW):
        self.window = window
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None  # [2 * window, nh, hd] each
        self._used = self.count = 0  # buffer rows in use; positions appended so far
        self.last_input: torch.Tensor | None = None  # [H]
        self._rows: torch.Tensor | None = None  # the last observed accepted rows [a, H], waiting for their tokens
        self._queued: list[tuple[torch.Tensor, torch.Tensor]] = []  # (rows [a, H], tokens long[a])

    def observe(self, rows: torch.Tensor) -> None:  # float[a, H], the root's first
        self._rows = rows

    def learn(self, emitted, device) -> None:
        """The step's emitted tokens: row ``i`` produced token ``i``; rows beyond them are dropped."""
        if self._rows is None:
            return
        n = min(len(emitted), self._rows.shape[0])
        if n:
            self._queued.append((self._rows[:n], torch.as_tensor(emitted[:n], dtype=torch.long, device=device)))
        self._rows = None

    def flush(self, layer: ContextLayer, embed) -> bool:
        """Append the queued positions (``embed``: ids long[n] -> float[n, H]); whether any position is cached."""
        if self._queued:
            rows = torch.cat([r for r, _ in self._queued]).to(layer.fc.weight.dtype)  # [n, H]
            tokens = torch.cat([t for _, t in self._queued])
            self._queued = []
            z = layer.inputs(rows, embed(tokens))  # [n, H]
            k, v = layer.keys(z, torch.arange(self.count, self.count + len(tokens), device=z.device))
            self._append(k[-self.window:], v[-self.window:])
            self.count += len(tokens)
            self.last_input = z[-1]
        return self.last_input is not None

    def _append(self, k: torch.Tensor, v: torch.Tensor) -> None:  # into buffers of twice the window
        if self._buffers is None:
            self._buffers = tuple(torch.empty((2 * self.window, *x.shape[1:]), dtype=x.dtype, device=x.device)
                                  for x in (k, v))
        n = len(k)
        if self._used + n > len(self._buffers[0]):  # full: the last window - n positions move to the front
            keep = self.window - n
            for buf in self._buffers:
                buf[:keep] = buf[self._used - keep : self._used].clone()
            self._used = keep
        for buf, x in zip(self._buffers, (k, v)):
            buf[self._used : self._used + n] = x
        self._used += n

    @property
    def keys(self) -> torch.Tensor:  # float[n, nh, hd], oldest first
        return self._buffers[0][max(0, self._used - self.window) : self._used]

    @property
    def values(self) -> torch.Tensor:
        return self._buffers[1][max(0, self._used - self.window) : self._used]
