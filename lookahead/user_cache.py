"""The user's cache directory: what lookahead keeps between processes (each file validated on read).

``curves/`` (cost curves, :mod:`lookahead.cost`), ``models/`` (the bundled model's weights,
:mod:`lookahead.tools.models`), ``corpora/`` (installed draft corpora, :mod:`lookahead.corpus`). The folder is
``$LOOKAHEAD_CACHE``, else ``$XDG_CACHE_HOME/lookahead``, else ``~/.cache/lookahead``; ``LOOKAHEAD_PERSIST=0`` turns
it off. Files are written to a temporary name and renamed, so a reader never sees half of one.
"""

from __future__ import annotations

import json
import os

PERSIST_ENV = "LOOKAHEAD_PERSIST"
CACHE_ENV = "LOOKAHEAD_CACHE"


def cache_dir() -> str:
    """The folder lookahead keeps its files in (not created here)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "lookahead")


def persist_enabled() -> bool:
    """False when ``LOOKAHEAD_PERSIST`` is 0 / false / no / off: the cache is then neither read nor written."""
    return os.environ.get(PERSIST_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def read_json(path: str) -> dict | None:
    """The JSON object in ``path``, or None when it is missing, unreadable or not a JSON object."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
