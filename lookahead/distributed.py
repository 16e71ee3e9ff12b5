"""Rank synchronisation under tensor parallelism: every rank of a sharded model makes the same decisions.

A model loaded with ``from_pretrained(..., tp_plan="auto")`` (or ``distributed_config=DistributedConfig(
tp_size=...)``) and launched with ``torchrun`` runs one process per rank; each holds a shard of every
projection, and every forward runs collectives inside the layers (an all-reduce after each row-wise
projection, an all-gather of the LM head's vocabulary shards). Every rank runs the same ``generate`` call on
the same prompt, so every rank must run forwards of the same shapes in the same order: the same draft at
every step. A step's draft follows from the tokens and the logits, which come out of the model gathered
and identical on every rank; it also follows from values read from one rank's clock or random state (the
calibrated cost curve, a measured copy or step time, the sampling seed), which do not. Those are taken
from rank 0; the rest is checked.

:class:`RankSync` is what a decode loop holds for that, one per call:

- :meth:`RankSync.broadcast`: rank 0's object (the cost curve a call prices drafts with);
- :meth:`RankSync.seeds`: rank 0's seeds for the sampling uniforms;
- :meth:`RankSync.check`: compares a few values (the step's forward inputs, say) across the ranks with one
  collective of a fixed size and raises :class:`RankDivergence`, on every rank, naming what differs and
  on which ranks, before the forward whose collectives the difference would break (where gloo aborts
  the processes and NCCL hangs); it also hands every rank rank 0's values of a few floats (``shared``);
- :meth:`RankSync.finish`: the loop's last check, so a rank that stops before the others is detected too.

Where ``torch.distributed`` is not initialised, the group has one rank, or the model is not sharded
(:meth:`RankSync.for_model`: ranks that each hold a whole model decode their own prompts), every method
is a no-op that returns its local value. Worked example, in each rank of ``torchrun --nproc-per-node 2``::

    sync = RankSync.for_model(model)                 # the model's tensor-parallel group
    curve = sync.broadcast(measured_curve)           # rank 0's curve on every rank
    (seed,) = sync.seeds(1)                          # rank 0's seed (each rank draws one, as alone)
    for step in range(steps):
        sync.check(step, inputs=(ids, positions), cached=cache_length)   # RankDivergence if any differs
        ...forward, verify, emit...
    sync.finish(step)

Only public torch APIs are used: ``torch.distributed`` collectives and a ``DTensor`` parameter's
``device_mesh``, which is how the group of a model sharded by transformers is found.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Mapping, Sequence

import numpy as np
import torch

MAX_FIELDS = 12
"""Values one :meth:`RankSync.check` compares at most (each one checksum in the fixed-size message)."""

MAX_SHARED = 8
"""Floats one :meth:`RankSync.check` hands over from rank 0 at most."""

_HEADER = 4  # slots before the fields: checksums of ``where`` and of the field names, the phase, the step
_WIDTH = _HEADER + MAX_FIELDS + MAX_SHARED  # int64 slots of every check's message, on every rank
_STEP, _FINISH = 1, 2  # phases: a step's check; the loop's end

CAUSES = (
    "every rank of a tensor-parallel model must make the same decisions; what differs usually comes from "
    "one rank's clock (a calibrated cost curve, a measured time) or random state (the sampling seed) that "
    "was not taken from rank 0, from a stopping criterion that reads the clock (max_time), or from logits "
    "that differ between the ranks"
)


class RankDivergence(RuntimeError):
    """The ranks of one tensor-parallel call disagree; raised on every rank by the same check.

    ``where``: the step (or label) checked; ``fields``: the names of the values that differ (empty when the
    ranks are at different steps or phases of the loop); ``ranks``: the ranks that differ from rank 0.
    """

    def __init__(self, message: str, where, fields: tuple[str, ...], ranks: tuple[int, ...]):
        super().__init__(message)
        self.where, self.fields, self.ranks = where, fields, ranks


# -- pure functions ------------------------------------------------------------------------------------------


def checksum(value) -> int:
    """A 64-bit checksum of ``value`` (a signed int64), the same in every process and on every machine.

    ``value``: None, a bool, int, float, str or bytes, a NumPy array or a torch tensor (its dtype, shape and
    elements; a tensor on an accelerator is copied to the host, a synchronisation), or a list, tuple or dict
    of these (nested). Unlike Python's ``hash``, nothing is salted per process. Arrays of equal elements but
    another dtype or shape have other checksums.

    Example: ``checksum([1, 2]) == checksum((1, 2))``; ``checksum(np.array([1, 2]))`` differs from both (an
    array is not a list), and ``checksum(np.int64(3)) == checksum(3)``.
    """
    h = hashlib.blake2b(digest_size=8)
    _feed(h, value)
    return struct.unpack("<q", h.digest())[0]


def _feed(h, value) -> None:
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise TypeError("checksum() does not take object arrays (their bytes are addresses)")
        _feed_array(h, value)
    elif isinstance(value, torch.Tensor):  # as the NumPy array of its elements (bfloat16: by its bytes)
        t = value.detach().cpu().contiguous()
        if t.dtype in _NUMPY_DTYPES:
            _feed_array(h, t.numpy())
        else:
            h.update(b"T" + str(t.dtype).encode() + b"|" + _shape(t.shape))
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif value is None:
        h.update(b"N")
    elif isinstance(value, (bool, np.bool_)):
        h.update(b"B1" if value else b"B0")
    elif isinstance(value, (int, np.integer)):
        h.update(b"I" + str(int(value)).encode() + b";")
    elif isinstance(value, (float, np.floating)):
        h.update(b"F" + struct.pack("<d", float(value)))
    elif isinstance(value, str):
        data = value.encode()
        h.update(b"S" + str(len(data)).encode() + b":" + data)
    elif isinstance(value, (bytes, bytearray)):
        h.update(b"Y" + str(len(value)).encode() + b":" + bytes(value))
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
        raise TypeError("checksum() takes None, numbers, str, bytes, arrays, tensors and lists or dicts of "
                        f"them; got {type(value).__name__}")


_NUMPY_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                           torch.float16, torch.float32, torch.float64})


def _shape(shape) -> bytes:
    return ",".join(map(str, shape)).encode() + b"|"


def _feed_array(h, arr: np.ndarray) -> None:
    h.update(b"A" + arr.dtype.str.encode() + b"|" + _shape(arr.shape))
    h.update(np.ascontiguousarray(arr).data)


@functools.lru_cache(maxsize=256)
def _names_checksum(names: tuple[str, ...]) -> int:
    return checksum(names)


def encode_message(where, phase: int, fields: Mapping[str, object], shared: Sequence[float] = ()
                   ) -> np.ndarray:
    """The fixed-size message one rank contributes to a check: int64[_WIDTH].

    Slots: the checksum of ``where`` (a step number or a label), the checksum of the field names (in order),
    ``phase`` (a step's check or the loop's end), the step number (-1 for a label), one checksum per field,
    then the ``shared`` floats (their IEEE-754 bits), zeros elsewhere. Every rank's message has the same size
    whatever it holds, so the collective that carries it never mismatches: a divergence is reported instead
    of breaking the collective.

    Example: ``encode_message(3, 1, {"ids": [5, 7]}, (0.25,))`` -> ``[checksum(3), checksum(("ids",)), 1, 3,
    checksum([5, 7]), 0, ..., bits of 0.25, 0, ...]``.
    """
    if len(fields) > MAX_FIELDS:
        raise ValueError(f"a check compares at most {MAX_FIELDS} values; got {len(fields)}: {list(fields)}")
    if len(shared) > MAX_SHARED:
        raise ValueError(f"a check hands over at most {MAX_SHARED} floats; got {len(shared)}")
    msg = np.zeros(_WIDTH, dtype=np.int64)
    msg[0], msg[1], msg[2] = checksum(where), _names_checksum(tuple(fields)), phase
    msg[3] = int(where) if isinstance(where, (int, np.integer)) and not isinstance(where, bool) else -1
    msg[_HEADER : _HEADER + len(fields)] = [checksum(v) for v in fields.values()]
    start = _HEADER + MAX_FIELDS
    msg[start : start + len(shared)] = np.asarray(shared, dtype=np.float64).view(np.int64)
    return msg


def shared_values(messages: np.ndarray, count: int) -> tuple[float, ...]:
    """Rank 0's first ``count`` shared floats from the gathered messages int64[ranks, _WIDTH]."""
    start = _HEADER + MAX_FIELDS
    return tuple(messages[0, start : start + count].copy().view(np.float64).tolist())


def find_divergence(messages: np.ndarray, names: Sequence[str]) -> str | None:
    """None when every rank's message (rows of ``messages``, int64[ranks, _WIDTH]) matches rank 0's in its
    header and fields; else what differs, in words, naming the fields and the ranks.

    Example: two ranks whose ``ids`` checksums differ at step 4 -> ``"at step 4, rank 1 differs from rank 0
    in: ids"``; rank 1 at the loop's end while rank 0 checks step 4 -> ``"rank 1 is at the end of the decode
    loop (after step 3) while rank 0 is at step 4"``.
    """
    ref = messages[0]
    out = []
    for r in range(1, messages.shape[0]):
        row = messages[r]
        if not np.array_equal(row[:3], ref[:3]):
            theirs, mine = _place(row), _place(ref)
            if theirs == mine:  # the same step, another set of values: another path through the loop
                theirs = f"{theirs} comparing other values ({len(names)} at rank 0)"
            out.append(f"rank {r} is {theirs} while rank 0 is {mine}")
            continue
        differ = [name for i, name in enumerate(names) if row[_HEADER + i] != ref[_HEADER + i]]
        if differ:
            out.append(f"{_place(ref)}, rank {r} differs from rank 0 in: {', '.join(differ)}")
    return "; ".join(out) or None


def _place(row: np.ndarray) -> str:
    step = f"step {int(row[3])}" if row[3] >= 0 else "a labelled check"
    return f"at the end of the decode loop (after {step})" if row[2] == _FINISH else f"at {step}"


def _diverged_ranks(messages: np.ndarray, names: Sequence[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    width = _HEADER + len(names)
    bad = [r for r in range(1, messages.shape[0])
           if not np.array_equal(messages[r, :width], messages[0, :width])]
    fields = tuple(name for i, name in enumerate(names)
                   if any(messages[r, _HEADER + i] != messages[0, _HEADER + i] for r in bad))
    return tuple(bad), fields


def model_group(model):
    """The process group of ``model``'s tensor parallelism, or None when its weights are not sharded.

    Read from the first ``DTensor`` parameter's ``device_mesh`` (public torch API): its "tp" dimension, or
    the mesh itself when it has one unnamed dimension (``torch.distributed.tensor.parallel`` applied by
    hand). A mesh of other dimensions only (FSDP's "fsdp", "dp_replicate") is not tensor parallelism: there
    each rank decodes its own batch, and nothing is synchronised. transformers shards the model over its
    ("tp",) mesh, for ``tp_plan="auto"`` as for ``DistributedConfig(tp_size=...)``.
    """
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return None
    from torch.distributed.tensor import DTensor

    for param in model.parameters():
        if not isinstance(param, DTensor):
            continue
        mesh = param.device_mesh
        names = mesh.mesh_dim_names
        if names is not None and "tp" in names:
            return mesh.get_group("tp") if mesh.ndim > 1 else mesh.get_group()
        if names is None and mesh.ndim == 1:
            return mesh.get_group()
    return None


def _collective_device(group) -> torch.device:
    """Where a collective's tensors must live for ``group``'s backend: the current CUDA device for NCCL."""
    backend = str(torch.distributed.get_backend(group)).lower()
    if "nccl" in backend and "gloo" not in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# -- the object a decode loop holds --------------------------------------------------------------------------


class RankSync:
    """The decisions of one decoding call, made identical on every rank of a tensor-parallel group.

    ``group``: a ``torch.distributed`` process group (None: the default group); ``enabled=False``: every
    method is a no-op (as when ``torch.distributed`` is not initialised or the group has one rank).
    ``every``: :meth:`check` runs its collective at step 0 and every ``every``-th step (checks with a label
    instead of a step number, and checks with ``shared`` values, always run). ``every=1`` detects a
    divergence before the first forward it would break; a larger ``every`` saves that collective on the
    other steps and may let a divergence reach a forward's collectives first.

    Every rank must call the same methods in the same order (collectives); the decode loop does, because
    with this object its decisions are the same on every rank. See the module docstring for an example.
    """

    def __init__(self, group=None, *, every: int = 1, enabled: bool = True):
        if every < 1:
            raise ValueError(f"every must be >= 1; got {every}")
        dist = torch.distributed
        self.every = every
        self.group = group
        self.active = bool(enabled and dist.is_available() and dist.is_initialized()
                           and dist.get_world_size(group) > 1)
        self.rank = dist.get_rank(group) if self.active else 0
        self.size = dist.get_world_size(group) if self.active else 1
        self._src = dist.get_global_rank(group, 0) if self.active and group is not None else 0
        self._device = _collective_device(group) if self.active else torch.device("cpu")
        self.collectives = 0  # collectives run so far (the cost of synchronising, for the statistics)

    @classmethod
    def for_model(cls, model, *, every: int = 1) -> RankSync:
        """The sync of the group ``model`` is sharded over (:func:`model_group`); inactive if it is not."""
        group = model_group(model)
        return cls(group, every=every, enabled=group is not None)

    def __repr__(self) -> str:
        if not self.active:
            return "RankSync(inactive)"
        return f"RankSync(rank {self.rank} of {self.size}, every={self.every})"

    def broadcast(self, obj):
        """Rank 0's ``obj`` on every rank (pickled; every rank passes its own, the others' are dropped).

        For what is computed on every rank but read from its clock: the measured cost curve (a
        ``CostModel``), a measured copy time. Every rank must still run whatever collective-running forwards
        the computation needs (a calibration times forwards of the sharded model: all ranks run them)."""
        if not self.active:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=self._src, group=self.group, device=self._device)
        self.collectives += 1
        return box[0]

    def seeds(self, count: int = 1) -> list[int]:
        """``count`` seeds for the sampling uniforms (``verify.PositionUniforms``), rank 0's on every rank.

        Every rank draws them from torch's default CPU generator as one process would
        (``torch.randint(0, 2**62, (1,))`` each), so its generator advances as it would alone and
        ``torch.manual_seed(s)`` on rank 0 gives the single-process run's seeds; then rank 0's are
        broadcast."""
        local = [int(torch.randint(0, 2**62, (1,)).item()) for _ in range(count)]
        if not self.active or not count:
            return local
        t = torch.tensor(local, dtype=torch.int64, device=self._device)
        torch.distributed.broadcast(t, src=self._src, group=self.group)
        self.collectives += 1
        return [int(v) for v in t.cpu().tolist()]

    def shared_clock(self, clock):
        """``clock`` read on every rank, rank 0's reading returned on every rank (one broadcast per reading).

        A timing loop whose decisions follow its readings (how many more rounds a busy machine needs) then
        takes the same decisions on every rank, so every rank runs the same sharded forwards; the measured
        times include the broadcast, as every synchronised step does. Inactive: ``clock`` itself."""
        if not self.active:
            return clock

        def read() -> float:
            t = torch.tensor([float(clock())], dtype=torch.float64, device=self._device)
            torch.distributed.broadcast(t, src=self._src, group=self.group)
            self.collectives += 1
            return float(t.item())

        return read

    def due(self, where) -> bool:
        """Whether :meth:`check` at ``where`` runs its collective (without ``shared`` values)."""
        return self.active and (not isinstance(where, (int, np.integer)) or where % self.every == 0)

    def check(self, where, *, shared: Sequence[float] = (), **fields) -> tuple[float, ...]:
        """Compare ``fields`` (name -> value, see :func:`checksum`) across the ranks; return rank 0's floats.

        ``where``: the step number (checked at step 0 and every ``every``-th) or a label such as
        ``"calibration"`` (always checked). Raises :class:`RankDivergence` on every rank when a field differs
        from rank 0's on some rank, or when a rank is at another step or has left the loop (:meth:`finish`).
        ``shared``: up to :data:`MAX_SHARED` floats of this rank (a step's measured seconds); rank 0's are
        returned, carried by the same collective (with ``shared`` the collective runs at every call).

        One ``all_gather`` of int64[_WIDTH] per rank; costs are in ``benchmarks/results/distributed.md``.
        """
        shared = tuple(float(s) for s in shared)
        if not self.active or not (shared or self.due(where)):
            return shared
        messages = self._gather(encode_message(where, _STEP, fields, shared))
        self._raise_if_diverged(messages, where, tuple(fields))
        return shared_values(messages, len(shared))

    def finish(self, where) -> None:
        """The loop's end (``where``: its last step): raises :class:`RankDivergence` on every rank if another
        rank is still decoding (then it is at a step's check, which this one meets: the same message size)."""
        if not self.active:
            return
        messages = self._gather(encode_message(where, _FINISH, {}))
        self._raise_if_diverged(messages, where, ())

    def _gather(self, message: np.ndarray) -> np.ndarray:
        dist = torch.distributed
        mine = torch.from_numpy(message).to(self._device)
        out = [torch.empty_like(mine) for _ in range(self.size)]
        dist.all_gather(out, mine, group=self.group)
        self.collectives += 1
        return torch.stack(out).cpu().numpy()  # int64[ranks, _WIDTH], rank order of the group

    def _raise_if_diverged(self, messages: np.ndarray, where, names: tuple[str, ...]) -> None:
        what = find_divergence(messages, names)
        if what is None:
            return
        ranks, fields = _diverged_ranks(messages, names)
        raise RankDivergence(f"the ranks of this tensor-parallel call diverged: {what}. {CAUSES}.", where,
                             fields, ranks)
