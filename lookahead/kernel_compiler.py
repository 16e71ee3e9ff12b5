"""The background process that compiles the Numba kernels into Numba's cache on a fresh install
(:func:`numba_kernels.kernels_ready` starts it), and the pause that keeps it off a running call's cores."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading


class _Compiler:
    """The background compiler this process started, and the calls keeping it stopped."""

    def __init__(self):
        self.lock = threading.Lock()
        self.process = None
        self.pausing = 0


_STATE = _Compiler()


def lock_path() -> str:
    from .user_cache import cache_dir

    return os.path.join(cache_dir(), "compiling-kernels.lock")


def lock_held() -> bool:
    """Whether a live process holds the compile lock (a stale lock, its process gone, is removed)."""
    path = lock_path()
    try:
        with open(path, encoding="utf-8") as f:
            pid = int(f.read().strip() or 0)
        os.kill(pid, 0)
        return True
    except (OSError, ValueError):
        with contextlib.suppress(OSError):
            os.remove(path)
        return False


def compiling() -> bool:
    """Whether a background process compiles the kernels: the one this process started, another live process
    that holds the lock, or one started now (``python -m lookahead.tools.warmup``, whose
    ``warmup.compile_in_background`` runs at the lowest CPU priority); False when none could be started."""
    process = _STATE.process
    if process is not None and process.poll() is None or lock_held():
        return True
    try:
        os.makedirs(os.path.dirname(lock_path()), exist_ok=True)
        _STATE.process = subprocess.Popen(
            [sys.executable, "-m", "lookahead.tools.warmup"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, close_fds=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    except OSError:
        return False
    logging.getLogger("lookahead").warning(
        "lookahead: compiling the Numba kernels in a background process (once per machine, lowest priority); "
        "until they are ready, calls decode as plain generate() does. `python -m lookahead warmup` compiles them "
        "ahead.")
    return True


def _die_with_parent() -> None:
    """In the child, before it runs (Linux): killed when the thread that started it ends, so that a compiler paused by
    :func:`paused` never outlives it (the kernels it compiled stay in the cache)."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def paused():
    """While entered, this process's background compiler (if one runs) is stopped, so that it takes no CPU from the
    call: a multi-threaded forward slows by several times when any other process runs on its cores."""
    process = _STATE.process
    if process is None or process.poll() is not None or not hasattr(signal, "SIGSTOP"):
        yield
        return
    with _STATE.lock:
        _STATE.pausing += 1
        with contextlib.suppress(OSError):
            os.kill(process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with _STATE.lock:
            _STATE.pausing -= 1
            if not _STATE.pausing:  # the last call running: it may go on
                with contextlib.suppress(OSError):
                    os.kill(process.pid, signal.SIGCONT)
