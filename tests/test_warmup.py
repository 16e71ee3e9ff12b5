"""``python -m lookahead warmup`` (``lookahead/tools/warmup.py``): every Numba kernel of the package is reached by
its runs, and a fresh process after it compiles nothing, whatever it decodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lookahead import kernel_compiler, numba_kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FRESH_DECODE = """
import torch
from lookahead.tools import warmup
from lookahead.decoder import LookaheadDecoder
{load}
ids = {ids}
for kw in ({{}}, {{"do_sample": True, "temperature": 0.7, "top_p": 0.9}}):
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24,
                   custom_generate=LookaheadDecoder(), **kw)
compiled, loaded = warmup.cache_counts()
print("compiled", compiled, "loaded", loaded)
"""


@pytest.fixture(scope="module")
def warmed():
    """The warm-up's report from a process that ran nothing else: a kernel only other tests reach (in this
    process, or into Numba's cache) would not hide from ``missed``."""
    proc = subprocess.run([sys.executable, "-c", "import json\nfrom lookahead.tools import warmup\n"
                           "print(json.dumps(warmup.compile_kernels()))"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_the_warm_up_reaches_every_kernel_of_the_package(warmed):
    assert warmed["failed"] == {} and warmed["missed"] == [] and warmed["kernels"] >= 20
    assert numba_kernels.kernels_compiled() is True
    names = {name for name, _ in numba_kernels.kernels()}
    assert {"lookahead.verify.rows_top", "lookahead.cache.kernels.insert", "lookahead.cache.suffix.propose",
            "lookahead.budget.choose", "lookahead.drafting.kernels.merge_trees", "lookahead.drafting.recycle._propose",
            "lookahead.drafting.trees.best_chain"} <= names


def test_missed_kernels_names_a_kernel_nothing_ran():
    import types

    from numba import njit

    mod = types.ModuleType("lookahead_fake_kernels")
    source = ("from numba import njit\n"
              "@njit(cache=False)\ndef never(x):\n    return x + 1\n"
              "@njit(cache=False)\ndef helper(x):\n    return x\n"
              "@njit(cache=False)\ndef caller(x):\n    return helper(x)\n")
    exec(source, mod.__dict__)
    assert njit  # the module's own import
    for value in vars(mod).values():
        if hasattr(value, "py_func"):
            value.py_func.__module__ = mod.__name__
    assert numba_kernels.missed_kernels([mod]) == ["lookahead_fake_kernels.never", "lookahead_fake_kernels.caller"]
    mod.caller(1)
    assert numba_kernels.missed_kernels([mod]) == ["lookahead_fake_kernels.never"]  # helper: compiled into caller


def test_a_fresh_process_after_the_warm_up_compiles_nothing(warmed):
    """The default decoder, greedy and sampled, on a float32 model, in a new process: every kernel it needs
    comes from Numba's cache."""
    script = FRESH_DECODE.format(load="model = warmup.tiny_model('float32')",
                                 ids="torch.tensor([[3, 10, 11, 12, 10, 11, 12, 10, 11]])")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[:2] == ["compiled", "0"], proc.stdout
    assert "not compiled yet" not in proc.stderr, proc.stderr


def test_the_warmup_command_announces_and_times_each_phase(warmed):
    proc = subprocess.run([sys.executable, "-m", "lookahead", "warmup", "--no-weights", "--threads", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert lines[0] == "compiling the Numba kernels (already compiled: checking) ..."
    assert lines[1].startswith("kernels: ") and " ready (0 compiled now, " in lines[1]
    assert lines[1].endswith(" s")
    assert lines[-1].startswith("warm-up done in ")


@pytest.mark.smollm
def test_the_bundled_model_after_the_warm_up_compiles_nothing_and_keeps_its_curve(warmed):
    """``warmup --calibrate`` on the bundled model, then a fresh process decoding with it: no kernel compiled,
    the weights read from their converted copy and the cost curve read back, not measured."""
    from lookahead.tools.models import smollm2_location

    try:
        smollm2_location()
    except RuntimeError as err:
        pytest.skip(f"SmolLM2 not installed ({err})")
    env = dict(os.environ)  # the session's cache folder (conftest), shared by both processes
    warm = subprocess.run([sys.executable, "-m", "lookahead", "warmup", "--calibrate", "--threads", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert warm.returncode == 0, warm.stderr[-3000:]
    script = FRESH_DECODE.format(
        load="import logging\nlogging.basicConfig(level=logging.INFO, format='%(message)s')\n"
             "torch.set_num_threads(1)\nfrom lookahead.tools.models import load_smollm2\n"
             "model, tok = load_smollm2()",
        ids="tok('def add(a, b):\\n    return a + b\\n\\ndef sub(a, b):', return_tensors='pt').input_ids")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[:2] == ["compiled", "0"], proc.stdout
    assert "from its converted weights" in proc.stderr, proc.stderr
    if "provisional" in warm.stderr:
        return  # the warm-up ran on a busy machine: a provisional curve is not kept, by design
    assert "using the cost curve measured for this model" in proc.stderr and "calibrating" not in proc.stderr


def _not_compiled(monkeypatch, started: list, alive: bool = True):
    """This process as a fresh install sees it: no kernel compiled, none in Numba's cache; starting the background
    compiler is recorded in ``started`` (a stand-in process, running while ``alive``)."""

    class Process:  # what stands for the compiler: a process of its own, which paused() stops and continues
        pid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]).pid

        def poll(self):
            return None if alive else 0

    def start():
        started.append(True)
        return Process()

    monkeypatch.setattr(numba_kernels, "_STATE", numba_kernels._Kernels())
    monkeypatch.setattr(kernel_compiler, "_STATE", kernel_compiler._Compiler())
    monkeypatch.setattr(numba_kernels, "missed_kernels", lambda modules=None: ["a kernel"])
    monkeypatch.setattr(numba_kernels, "kernels_compiled", lambda modules=None: False)
    monkeypatch.setattr(kernel_compiler.subprocess, "Popen", lambda *args, **kwargs: start())


def test_uncompiled_kernels_compile_in_the_background_and_the_call_decodes_plain(monkeypatch, tiny_models):
    """A fresh install: the call starts one background compiler and decodes as plain generate() does (the same
    tokens, one forward per token, said by explain()); a second call while it runs starts no other; once the cache
    holds the kernels the decoder drafts again."""
    import torch

    from lookahead.decoder import LookaheadDecoder

    model = tiny_models("llama")
    ids = torch.tensor([[3, 10, 11, 12, 13, 14] * 4])
    plain = model.generate(ids, max_new_tokens=16, do_sample=False)
    started: list = []
    _not_compiled(monkeypatch, started)
    decoder = LookaheadDecoder()
    for _ in range(2):
        out = model.generate(ids, max_new_tokens=16, do_sample=False, custom_generate=decoder)
        assert torch.equal(out, plain)
        assert decoder.stats.target_calls == decoder.stats.new_tokens == 16
        assert "decoded as plain generate() does, because the Numba kernels were still compiling" in \
            decoder.stats.explain()
    assert started == [True]
    monkeypatch.setattr(numba_kernels, "kernels_compiled", lambda modules=None: True)
    out = model.generate(ids, max_new_tokens=16, do_sample=False, custom_generate=decoder)
    assert torch.equal(out, plain) and decoder.stats.plain_reason is None
    assert decoder.stats.target_calls < 16


def test_a_compile_lock_left_by_a_dead_process_is_taken_over(monkeypatch, tmp_path):
    """The lock file names the compiling process; when that process is gone the lock is stale and removed, so a
    new compiler can start; while it lives, nobody else starts one."""
    monkeypatch.setenv("LOOKAHEAD_CACHE", str(tmp_path))
    path = kernel_compiler.lock_path()
    with open(path, "w") as f:
        f.write(str(os.getpid()))  # this process: alive
    monkeypatch.setattr(kernel_compiler, "_STATE", kernel_compiler._Compiler())
    assert kernel_compiler.lock_held() and kernel_compiler.compiling() and kernel_compiler._STATE.process is None
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with open(path, "w") as f:
        f.write(str(dead.pid))
    assert not kernel_compiler.lock_held() and not os.path.exists(path)


def test_the_background_compiler_waits_for_a_live_lock_and_takes_over_a_stale_one(monkeypatch, tmp_path):
    """``python -m lookahead.tools.warmup`` returns at once while a live process holds the lock; a lock its holder left
    behind (killed with the call that started it) is taken over: it compiles under a lock of its own, then unlocks."""
    from lookahead.tools import warmup

    monkeypatch.setenv("LOOKAHEAD_CACHE", str(tmp_path))
    monkeypatch.setattr(os, "nice", lambda n: 0)  # not this test process's priority
    path = kernel_compiler.lock_path()
    compiled: list = []
    monkeypatch.setattr(warmup, "compile_kernels", lambda: compiled.append(open(path).read()))
    with open(path, "w") as f:
        f.write(str(os.getpid()))  # alive
    warmup.compile_in_background()
    assert compiled == [] and os.path.exists(path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with open(path, "w") as f:
        f.write(str(dead.pid))
    warmup.compile_in_background()
    assert compiled == [str(os.getpid())] and not os.path.exists(path)


def test_compile_inline_runs_every_call_through_the_decoder(monkeypatch):
    """After compile_inline() (warmup, the tests) kernels compile where first used: ready at once, nothing started."""
    started: list = []
    _not_compiled(monkeypatch, started)
    numba_kernels.compile_inline()
    assert numba_kernels.kernels_ready() and not started
