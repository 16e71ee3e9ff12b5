"""``python -m lookahead warmup`` (``lookahead/tools/warmup.py``): every Numba kernel of the package is reached by
its runs, and a fresh process after it compiles nothing, whatever it decodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lookahead import numba_kernels

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
            "lookahead.drafting.kernels.best_chain"} <= names


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


def test_the_first_call_says_once_when_kernels_will_compile(monkeypatch, caplog):
    """Without a warm-up the first decoder call of a process says it compiles (once); after mark_checked() (what
    the warm-up calls before compiling) nothing is said."""
    import logging

    monkeypatch.setattr(numba_kernels, "_CHECKED", [])
    monkeypatch.setattr(numba_kernels, "kernels_compiled", lambda modules=None: False)
    with caplog.at_level(logging.WARNING, logger="lookahead"):
        numba_kernels.warn_if_uncompiled()
        numba_kernels.warn_if_uncompiled()
    assert [r.getMessage() for r in caplog.records].count(
        "lookahead: the Numba kernels are not compiled yet, so this first call compiles the ones it needs "
        "(tens of seconds, once per machine); `python -m lookahead warmup` compiles them ahead") == 1
    caplog.clear()
    monkeypatch.setattr(numba_kernels, "_CHECKED", [])
    numba_kernels.mark_checked()
    with caplog.at_level(logging.WARNING, logger="lookahead"):
        numba_kernels.warn_if_uncompiled()
    assert not caplog.records
