"""Tensor parallelism: every rank of a sharded model (``tp_plan="auto"``, collectives inside its layers) must run
forwards of the same shapes in the same order. :class:`RankSync` takes what one rank's clock or random state gives
from rank 0 and compares each step's inputs, a difference raising :class:`RankDivergence` on every rank."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence

import numpy as np
import torch

MAX_FIELDS, MAX_SHARED = 12, 8  # values one RankSync.check compares, and floats it hands over from rank 0, at most

_HEADER = 4  # slots before the fields: checksums of ``where`` and of the field names, the phase, the step
_SHARED = _HEADER + MAX_FIELDS  # the first slot of the shared floats
_WIDTH = _SHARED + MAX_SHARED  # int64 slots of every message
_STEP, _FINISH = 1, 2  # phases: a step's check; the loop's end

CAUSES = ("every rank of a tensor-parallel model must make the same decisions; what differs usually comes from one "
          "rank's clock (a calibrated cost curve, a measured time) or random state (the sampling seed) that was not "
          "taken from rank 0, from a stopping criterion that reads the clock (max_time), or from logits that differ "
          "between the ranks")


class RankDivergence(RuntimeError):
    """The ranks of one call disagree, raised on every rank. ``where``: the step or label checked; ``fields``: the
    names of the values that differ (empty when the ranks are elsewhere in the loop); ``ranks``: those unlike rank 0."""

    def __init__(self, message: str, where, fields: tuple[str, ...], ranks: tuple[int, ...]):
        super().__init__(message)
        self.where, self.fields, self.ranks = where, fields, ranks


def checksum(value) -> int:
    """A signed 64-bit checksum of ``value``, the same in every process (unlike ``hash``): None, a bool, number, str
    or bytes, an array or tensor (dtype, shape, elements), or lists, tuples and dicts of these. A list and a tuple
    agree; an array and a list do not."""
    h = hashlib.blake2b(digest_size=8)
    _feed(h, value)
    return struct.unpack("<q", h.digest())[0]


_NUMPY_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                           torch.float16, torch.float32, torch.float64})


def _feed(h, value) -> None:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().contiguous()
        if value.dtype not in _NUMPY_DTYPES:  # bfloat16 and others: by their bytes
            h.update(f"T{value.dtype}|{','.join(map(str, value.shape))}|".encode())
            h.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
            return
        value = value.numpy()
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise TypeError("checksum() does not take object arrays (their bytes are addresses)")
        h.update(f"A{value.dtype.str}|{','.join(map(str, value.shape))}|".encode())
        h.update(np.ascontiguousarray(value).data)
    elif value is None:
        h.update(b"N")
    elif isinstance(value, (bool, np.bool_)):
        h.update(b"B1" if value else b"B0")
    elif isinstance(value, (int, np.integer)):
        h.update(b"I" + str(int(value)).encode() + b";")
    elif isinstance(value, (float, np.floating)):
        h.update(b"F" + struct.pack("<d", float(value)))
    elif isinstance(value, (str, bytes, bytearray)):
        data = value.encode() if isinstance(value, str) else bytes(value)
        h.update((b"S" if isinstance(value, str) else b"Y") + str(len(data)).encode() + b":" + data)
    elif isinstance(value, Mapping):
        h.update(b"D" + str(len(value)).encode() + b":")
        for key in sorted(value, key=str):
            _feed(h, str(key))
            _feed(h, value[key])
    elif isinstance(value, (list, tuple)):
        h.update(b"L" + str(len(value)).encode() + b":")
        for item in value:
            _feed(h, item)
    else:
        raise TypeError("checksum() takes None, numbers, str, bytes, arrays, tensors and lists or dicts of them; got "
                        f"{type(value).__name__}")


def encode_message(where, phase: int, fields: Mapping[str, object], shared: Sequence[float] = ()) -> np.ndarray:
    """One rank's message int64[_WIDTH]: the checksums of ``where`` (a step or a label) and of the field names,
    ``phase``, the step (-1 for a label), one checksum per field, then the ``shared`` floats' bits. One size on every
    rank, so a divergence is reported instead of breaking the collective."""
    if len(fields) > MAX_FIELDS:
        raise ValueError(f"a check compares at most {MAX_FIELDS} values; got {len(fields)}: {list(fields)}")
    if len(shared) > MAX_SHARED:
        raise ValueError(f"a check hands over at most {MAX_SHARED} floats; got {len(shared)}")
    msg = np.zeros(_WIDTH, dtype=np.int64)
    msg[0], msg[1], msg[2] = checksum(where), checksum(tuple(fields)), phase
    msg[3] = int(where) if isinstance(where, (int, np.integer)) and not isinstance(where, bool) else -1
    msg[_HEADER : _HEADER + len(fields)] = [checksum(v) for v in fields.values()]
    msg[_SHARED : _SHARED + len(shared)] = np.asarray(shared, dtype=np.float64).view(np.int64)
    return msg


def shared_values(messages: np.ndarray, count: int) -> tuple[float, ...]:
    """Rank 0's first ``count`` shared floats from the gathered messages int64[ranks, _WIDTH]."""
    return tuple(messages[0, _SHARED : _SHARED + count].copy().view(np.float64).tolist())


def _differ(messages: np.ndarray, names: Sequence[str]) -> list[tuple[int, bool, list[str]]]:
    """(rank, whether it is elsewhere in the loop, the fields that differ) of each rank unlike rank 0."""
    ref, out = messages[0], []
    for r in range(1, messages.shape[0]):
        elsewhere = not np.array_equal(messages[r, :3], ref[:3])
        fields = [] if elsewhere else [n for i, n in enumerate(names) if messages[r, _HEADER + i] != ref[_HEADER + i]]
        if elsewhere or fields:
            out.append((r, elsewhere, fields))
    return out


def find_divergence(messages: np.ndarray, names: Sequence[str]) -> str | None:
    """What differs from rank 0's message among ``messages`` int64[ranks, _WIDTH], in words (``"at step 4, rank 1
    differs from rank 0 in: ids"``); None when nothing does."""
    out = []
    for r, elsewhere, fields in _differ(messages, names):
        if not elsewhere:
            out.append(f"{_place(messages[0])}, rank {r} differs from rank 0 in: {', '.join(fields)}")
            continue
        theirs, mine = _place(messages[r]), _place(messages[0])
        if theirs == mine:  # the same step, another set of values: another path through the loop
            theirs = f"{theirs} comparing other values ({len(names)} at rank 0)"
        out.append(f"rank {r} is {theirs} while rank 0 is {mine}")
    return "; ".join(out) or None


def _place(row: np.ndarray) -> str:
    step = f"step {int(row[3])}" if row[3] >= 0 else "a labelled check"
    return f"at the end of the decode loop (after {step})" if row[2] == _FINISH else f"at {step}"


def model_group(model):
    """The process group of ``model``'s tensor parallelism (its first ``DTensor`` parameter's mesh: the "tp"
    dimension, or the one unnamed dimension); None when not sharded or on another mesh (FSDP's)."""
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return None
    from torch.distributed.tensor import DTensor

    for param in model.parameters():
        if isinstance(param, DTensor):
            mesh = param.device_mesh
            names = mesh.mesh_dim_names
            if names is not None and "tp" in names:
                return mesh.get_group("tp") if mesh.ndim > 1 else mesh.get_group()
            if names is None and mesh.ndim == 1:
                return mesh.get_group()
    return None


class RankSync:
    """The decisions of one decoding call, identical on every rank of ``group`` (None: the default one), each rank
    calling the same methods in the same order. Inactive (``enabled=False``, no ``torch.distributed`` or one rank):
    every method returns its local value. ``every``: :meth:`check` compares every ``every``-th step (always with a
    label or ``shared`` values)."""

    def __init__(self, group=None, *, every: int = 1, enabled: bool = True):
        if every < 1:
            raise ValueError(f"every must be >= 1; got {every}")
        dist = torch.distributed
        self.every, self.group = every, group
        self.active = bool(enabled and dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1)
        self.rank = dist.get_rank(group) if self.active else 0
        self.size = dist.get_world_size(group) if self.active else 1
        self._src = dist.get_global_rank(group, 0) if self.active and group is not None else 0
        self._device = torch.device("cpu")
        if self.active:  # NCCL's tensors live on the current CUDA device
            backend = str(dist.get_backend(group)).lower()
            if "nccl" in backend and "gloo" not in backend:
                self._device = torch.device("cuda", torch.cuda.current_device())
        self.collectives = 0  # collectives run so far

    @classmethod
    def for_model(cls, model, *, every: int = 1) -> RankSync:
        """The sync of :func:`model_group`; inactive for a model not sharded."""
        group = model_group(model)
        return cls(group, every=every, enabled=group is not None)

    def __repr__(self) -> str:
        return f"RankSync(rank {self.rank} of {self.size}, every={self.every})" if self.active else "RankSync(inactive)"

    def broadcast(self, obj):
        """Rank 0's ``obj`` (pickled) on every rank."""
        if not self.active:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=self._src, group=self.group, device=self._device)
        self.collectives += 1
        return box[0]

    def seeds(self, count: int = 1) -> list[int]:
        """``count`` seeds, rank 0's on every rank, each drawn as one process would: ``torch.randint(0, 2**62, (1,))``."""
        local = [int(torch.randint(0, 2**62, (1,)).item()) for _ in range(count)]
        if not self.active or not count:
            return local
        t = torch.tensor(local, dtype=torch.int64, device=self._device)
        torch.distributed.broadcast(t, src=self._src, group=self.group)
        self.collectives += 1
        return t.cpu().tolist()

    def check(self, where, *, shared: Sequence[float] = (), **fields) -> tuple[float, ...]:
        """Compare ``fields`` (name -> value, see :func:`checksum`) at ``where`` (a step or a label) across the ranks
        (one ``all_gather``), raising :class:`RankDivergence` on a difference; returns rank 0's ``shared`` floats."""
        shared = tuple(float(s) for s in shared)
        due = shared or not isinstance(where, (int, np.integer)) or where % self.every == 0
        if not self.active or not due:
            return shared
        messages = self._gather(encode_message(where, _STEP, fields, shared))
        self._raise_if_diverged(messages, where, tuple(fields))
        return shared_values(messages, len(shared))

    def finish(self, where) -> None:
        """The loop's end after step ``where``: :class:`RankDivergence` if another rank is still decoding."""
        if self.active:
            self._raise_if_diverged(self._gather(encode_message(where, _FINISH, {})), where, ())

    def _gather(self, message: np.ndarray) -> np.ndarray:
        mine = torch.from_numpy(message).to(self._device)
        out = [torch.empty_like(mine) for _ in range(self.size)]
        torch.distributed.all_gather(out, mine, group=self.group)
        self.collectives += 1
        return torch.stack(out).cpu().numpy()  # int64[ranks, _WIDTH], in the group's rank order

    def _raise_if_diverged(self, messages: np.ndarray, where, names: tuple[str, ...]) -> None:
        differ = _differ(messages, names)
        if differ:
            what = find_divergence(messages, names)
            fields = tuple(n for n in names if any(n in f for _, _, f in differ))
            raise RankDivergence(f"the ranks of this tensor-parallel call diverged: {what}. {CAUSES}.", where, fields,
                                 tuple(r for r, _, _ in differ))
