"""`DraftHeads`: the heads' modules, their settings, and their files: ``heads.safetensors`` (weights in float16,
``vocab_ids``) and ``heads.json`` (:meth:`DraftHeads.header`; format version 1: Medusa and feature heads, 2: Medusa
heads with their own output layers, 3: the context head; a newer version is refused), or the original Medusa's."""

from __future__ import annotations

import copy
import json
import os
import threading
from dataclasses import dataclass, replace

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..kept import HEADS as BUNDLED
from ..kept import check_model, fingerprint
from .context import ContextLayer, attention_heads, rms
from .source import DTYPES, HeadsSource

FORMAT = "lookahead-draft-heads"
VERSION = 3
KINDS = ("medusa", "feature", "context")
WEIGHTS_FILE, HEADER_FILE, DEFAULT_FILE = "heads.safetensors", "heads.json", "default.txt"
MEDUSA_CONFIG, MEDUSA_WEIGHTS = "config.json", ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
FEATURE_DEPTH = 6  # a feature or context head's default draft depth (usefully past the depth it was trained to)


def invalid(settings, name: str, why: str) -> ValueError:
    """The error for field ``name`` of a settings object: ``"HeadsSettings.topk=0 is invalid: ..."``."""
    return ValueError(f"{type(settings).__name__}.{name}={getattr(settings, name)!r} is invalid: {why}")


def check_ints(settings, bounds: dict[str, tuple[int, int]]) -> None:
    """Raise :func:`invalid` unless each field ``name`` of ``settings`` is an int in ``bounds[name]`` (inclusive)."""
    for name, (low, high) in bounds.items():
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise invalid(settings, name, f"must be an int in [{low}, {high}]")


@dataclass(frozen=True)
class HeadsSettings:
    """How the heads draft (never what the output is): at most ``max_nodes`` nodes, ``max_depth`` deep (0: Medusa's
    K, else ``max(FEATURE_DEPTH, K)``), ``topk`` candidates per head or expanded node, ``width`` paths per level;
    ``cost``: their seconds ``(base, per level)`` (None: measured); ``dtype``: ``"float32"``, ``"bfloat16"`` or
    ``"auto"`` (the faster, measured, on a CPU; a context head always float32)."""

    max_nodes: int = 127
    max_depth: int = 0
    topk: int = 10
    width: int = 8
    cost: tuple[float, float] | None = None
    dtype: str = "auto"

    def __post_init__(self) -> None:
        check_ints(self, {"max_nodes": (1, 256), "max_depth": (0, 64), "topk": (1, 64), "width": (1, 64)})
        if self.cost is not None:
            try:
                base, per = (float(c) for c in self.cost)
            except (TypeError, ValueError):
                raise invalid(self, "cost", "must be (base seconds, seconds per level) or None") from None
            if base < 0 or per < 0:
                raise invalid(self, "cost", "seconds must be >= 0")
            object.__setattr__(self, "cost", (base, per))
        if self.dtype not in DTYPES:
            raise invalid(self, "dtype", f"must be one of {tuple(DTYPES)}")


class DraftHeads(nn.Module):
    """K trained draft heads of one kind (:data:`KINDS`) over a frozen target model whose ``fingerprint`` is
    ``target``: Medusa heads, or the depth a feature / context head was trained to. ``vocab_ids`` int64[Vk]: the
    LM-head rows they predict (``own_outputs``, Medusa only: their own output layers ``head_out[k]`` [Vk, H]);
    ``trained_on``: JSON-safe description of the training; ``ffn``: MLP width / H; ``attention``: a context head's
    attention heads. Parameters stay float32 on the CPU; other devices and dtypes get copies (:meth:`on_device`)."""

    def __init__(self, kind: str, num_heads: int, hidden_size: int, vocab_ids, target: dict | None = None,
                 trained_on: dict | None = None, ffn: int = 2, settings: HeadsSettings | None = None,
                 dropout: float = 0.0, own_outputs: bool = False, attention: int | None = None):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"DraftHeads kind={kind!r} is invalid: must be one of {KINDS}")
        if own_outputs and kind != "medusa":
            raise ValueError(f"DraftHeads own_outputs=True is invalid for kind={kind!r}: only Medusa heads have them")
        if not 1 <= num_heads <= 16:
            raise ValueError(f"DraftHeads num_heads={num_heads!r} is invalid: must be in [1, 16]")
        ids = torch.as_tensor(np.asarray(vocab_ids), dtype=torch.long)
        if ids.ndim != 1 or not len(ids):
            raise ValueError("DraftHeads vocab_ids must be a non-empty 1-D list of token ids")
        self.kind, self.num_heads, self.hidden_size, self.ffn = kind, int(num_heads), int(hidden_size), int(ffn)
        self.target, self.trained_on = target, dict(trained_on or {})  # (nn.Module owns `training`: the mode)
        self.settings = settings or HeadsSettings()
        self.own_outputs = bool(own_outputs)
        h, k = self.hidden_size, self.num_heads
        self.register_buffer("vocab_ids", ids.clone())  # long[Vk]
        self.register_buffer("temperature", torch.ones(k))  # per head / level, fitted on held-out rows
        if kind == "medusa":  # head k: r = h + silu(W_k h + b_k), W_k zero: an untrained head is the LM head
            self.block_weight = nn.Parameter(torch.zeros(k, h, h))
            self.block_bias = nn.Parameter(torch.zeros(k, h))
            if own_outputs:
                self.head_out = nn.Parameter(torch.zeros(k, len(ids), h))
        elif kind == "context":
            self.context = ContextLayer(h, self.ffn, attention or attention_heads(h), dropout)
        else:  # feature: f' = z + mlp(z), z = fc([n(f), n(e)])
            self.fc = nn.Linear(2 * h, h)
            self.up, self.down = nn.Linear(h, self.ffn * h), nn.Linear(self.ffn * h, h)
            nn.init.zeros_(self.down.weight)
            nn.init.zeros_(self.down.bias)
        self.drop = nn.Dropout(dropout)
        self._devices: dict = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:  # copy / pickle: no lock, no per-device copies
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_devices")}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._devices, self._lock = {}, threading.Lock()

    def medusa_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """float[N, K, H]: each Medusa head's residual block of ``hidden`` float[N, H]."""
        z = torch.einsum("nj,kij->nki", self.drop(hidden), self.block_weight) + self.block_bias
        return hidden[:, None, :] + nn.functional.silu(z)

    def medusa_logits(self, rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """float[..., d, Vk]: head ``k``'s logits of ``rows[..., k, :]``, by the LM-head rows ``weight`` or its own."""
        if self.own_outputs:
            return torch.einsum("...kh,kvh->...kv", rows, self.head_out[: rows.shape[-2]])
        return nn.functional.linear(rows, weight, bias)

    def feature_step(self, feature: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """float[N, H]: the next feature from the current one and its token's embedding (both [N, H])."""
        z = self.fc(self.drop(torch.cat([rms(feature), rms(embedding)], -1)))
        return z + self.down(self.drop(nn.functional.silu(self.up(z))))

    def check_model(self, model) -> None:
        """Raise ValueError unless these heads were trained for ``model``."""
        if self.target is None:
            raise ValueError("these draft heads carry no target fingerprint (DraftHeads(target=None)); build "
                             "them with DraftHeads.for_model(model, ...) or load saved ones")
        check_model(self.target, model)

    @classmethod
    def for_model(cls, model, kind: str, num_heads: int, vocab_ids, **kwargs) -> DraftHeads:
        """Untrained heads for ``model`` (its fingerprint and hidden size), predicting ``vocab_ids``."""
        target = fingerprint(model)
        return cls(kind, num_heads, target["hidden_size"], vocab_ids, target=target, **kwargs)

    def on_device(self, device, dtype: torch.dtype = torch.float32) -> DraftHeads:
        """These heads on ``device`` in ``dtype``: themselves on the CPU in float32, else a frozen copy made once."""
        device = torch.device(device)
        if device.type == "cpu" and dtype == torch.float32:
            return self
        with self._lock:
            if (device, dtype) not in self._devices:
                clone = copy.deepcopy(self)  # (a copy leaves the other devices' copies behind)
                self._devices[(device, dtype)] = clone.to(device=device, dtype=dtype).requires_grad_(False)
            return self._devices[(device, dtype)]

    def make_source(self, most_nodes: int | None = None, tuning=None):
        """The draft source of these heads for one decoder, ``most_nodes`` (a step's most) capping the tree."""
        s = self.settings
        nodes = s.max_nodes if most_nodes is None else max(1, min(s.max_nodes, int(most_nodes)))
        depth = s.max_depth or (self.num_heads if self.kind == "medusa" else max(FEATURE_DEPTH, self.num_heads))
        return HeadsSource(self, nodes, depth, s.topk, s.width, s.cost, s.dtype)

    def with_settings(self, **changes) -> DraftHeads:
        """These heads (the same parameters) drafting with other :class:`HeadsSettings` fields."""
        other = copy.copy(self)  # shares the parameters; no per-device copies
        other.settings = replace(self.settings, **changes)
        return other

    def header(self) -> dict:
        """What ``heads.json`` holds."""
        head = {"format": FORMAT, "version": 3 if self.kind == "context" else 2 if self.own_outputs else 1,
                "kind": self.kind, "num_heads": self.num_heads, "hidden_size": self.hidden_size, "ffn": self.ffn,
                "vocab": int(len(self.vocab_ids)), "temperature": [round(float(t), 6) for t in self.temperature],
                "target": self.target, "training": self.trained_on}
        if self.own_outputs:
            head["own_outputs"] = True
        if self.kind == "context":
            head["attention_heads"] = self.context.heads
        return head

    def save(self, folder: str) -> None:
        """Write ``heads.safetensors`` and ``heads.json`` into ``folder``."""
        os.makedirs(folder, exist_ok=True)
        tensors = {name: p.detach().to("cpu", torch.float16).contiguous() for name, p in self.named_parameters()}
        tensors["vocab_ids"] = self.vocab_ids.cpu().contiguous()
        save_file(tensors, os.path.join(folder, WEIGHTS_FILE), metadata={"format": FORMAT, "version": str(VERSION)})
        with open(os.path.join(folder, HEADER_FILE), "w", encoding="utf-8") as f:
            json.dump(self.header(), f, indent=1)
            f.write("\n")

    @classmethod
    def load(cls, folder: str, model=None, **settings) -> DraftHeads:
        """Heads written by :meth:`save` (a training run's folder: those its ``default.txt`` names); with ``model``,
        refused (ValueError) unless trained for it. ``settings``: :class:`HeadsSettings` fields."""
        path, default = os.path.join(folder, HEADER_FILE), os.path.join(folder, DEFAULT_FILE)
        if not os.path.exists(path) and os.path.exists(default):
            with open(default, encoding="utf-8") as f:
                return cls.load(os.path.join(folder, f.read().strip()), model, **settings)
        if not os.path.exists(path):
            raise FileNotFoundError(f"no {HEADER_FILE} in {folder!r}: not a folder written by DraftHeads.save")
        with open(path, encoding="utf-8") as f:
            head = json.load(f)
        if head.get("format") != FORMAT or not isinstance(head.get("version"), int):
            raise ValueError(f"{path} is not a lookahead draft-heads header (format {head.get('format')!r})")
        if head["version"] > VERSION:
            raise ValueError(f"{path} has format version {head['version']}; this lookahead reads up to {VERSION}")
        tensors = load_file(os.path.join(folder, WEIGHTS_FILE))
        heads = cls(head["kind"], head["num_heads"], head["hidden_size"], tensors.pop("vocab_ids"),
                    target=head.get("target"), trained_on=head.get("training"), ffn=head.get("ffn", 2),
                    settings=HeadsSettings(**settings), own_outputs=bool(head.get("own_outputs", False)),
                    attention=head.get("attention_heads"))
        state = {k: v.float() for k, v in tensors.items()}
        state["vocab_ids"] = heads.vocab_ids
        state["temperature"] = torch.tensor(head.get("temperature", [1.0] * heads.num_heads), dtype=torch.float32)
        heads.load_state_dict(state, strict=True)
        if model is not None:
            heads.check_model(model)
        return heads.eval()

    @classmethod
    def from_medusa(cls, folder: str, model, **settings) -> DraftHeads:
        """Medusa heads for ``model`` saved by FasterDecoding/Medusa: ``config.json`` (``medusa_num_heads``,
        ``medusa_num_layers`` 0 or 1) and ``medusa_lm_head.safetensors`` or ``.pt`` (per head ``i``:
        ``{i}.0.linear.weight``/``.bias``, then ``{i}.1.weight`` [V, H] unless the LM head is shared); sizes that do
        not fit ``model`` are refused. ``settings``: :class:`HeadsSettings` fields."""
        config_path = os.path.join(folder, MEDUSA_CONFIG)
        if not os.path.exists(config_path):
            raise FileNotFoundError(f"no {MEDUSA_CONFIG} in {folder!r}: not a Medusa heads folder")
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
        if "medusa_num_heads" not in config:
            raise ValueError(f"{config_path} has no medusa_num_heads: not a Medusa heads config")
        num_heads, layers = int(config["medusa_num_heads"]), int(config.get("medusa_num_layers", 1))
        if layers not in (0, 1):
            raise ValueError(f"Medusa heads with medusa_num_layers={layers} cannot be read: each lookahead Medusa "
                             "head holds one residual block (0 or 1)")
        weights = next((p for p in (os.path.join(folder, n) for n in MEDUSA_WEIGHTS) if os.path.exists(p)), None)
        if weights is None:
            raise FileNotFoundError(f"no {' or '.join(MEDUSA_WEIGHTS)} in {folder!r}")
        state = (load_file(weights) if weights.endswith(".safetensors")
                 else torch.load(weights, map_location="cpu", weights_only=True))
        state = {k.removeprefix("medusa_head."): v for k, v in state.items()}
        target = fingerprint(model)
        hidden, vocab = target["hidden_size"], target["vocab_size"]
        own = f"0.{layers}.weight" in state

        def tensor(name, shape):
            if name not in state:
                raise ValueError(f"{weights} has no {name!r}: not the Medusa heads of a {num_heads}-head config")
            if tuple(state[name].shape) != shape:
                raise ValueError(f"{weights}: {name} is {tuple(state[name].shape)}, {shape} fits this model "
                                 f"(hidden size {hidden}, vocabulary {vocab}): heads for another model")
            return state[name].float()

        heads = cls("medusa", num_heads, hidden, np.arange(vocab), target=target, own_outputs=own,
                    trained_on={"source": "Medusa checkpoint", "folder": os.path.abspath(folder),
                                "base_model": config.get("base_model_name_or_path")},
                    settings=HeadsSettings(**settings))
        with torch.no_grad():
            for i in range(num_heads):
                if layers:
                    heads.block_weight[i] = tensor(f"{i}.0.linear.weight", (hidden, hidden))
                    heads.block_bias[i] = tensor(f"{i}.0.linear.bias", (hidden,))
                if own:
                    heads.head_out[i] = tensor(f"{i}.{layers}.weight", (vocab, hidden))
        return heads.eval()

    @classmethod
    def bundled(cls, kind: str | None = None, **settings) -> DraftHeads:
        """The heads shipped for the bundled SmolLM2-135M-Instruct: ``kind`` ``"medusa"``, ``"feature"`` or None."""
        return cls.load(BUNDLED if kind is None else os.path.join(BUNDLED, kind), **settings)

    def __repr__(self) -> str:
        return (f"DraftHeads(kind={self.kind!r}, num_heads={self.num_heads}, hidden_size={self.hidden_size}, "
                f"vocab={len(self.vocab_ids)}, target={(self.target or {}).get('architecture')})")
