"""Shared fixtures: tiny random models built from configs (no downloads) and the bundled SmolLM2."""

from __future__ import annotations

import os

import pytest
import torch

from tiny import TINY_COST_CURVE, tiny_model

from lookahead.numba_kernels import compile_inline

# Kernels compile inside the first call that needs them, as before a background compiler existed: every call
# drafts from its first step (tests/test_warmup.py tests the background compiler itself).
compile_inline()

# Tiny models run far faster on one thread (no OpenMP hand-offs, no spinning when cores are busy);
# the SmolLM2 tests switch to all cores for their duration. LOOKAHEAD_TEST_THREADS=2 runs the tiny
# models on two threads instead: no test's outcome may depend on it.
_ALL_THREADS = torch.get_num_threads()
_TEST_THREADS = int(os.environ.get("LOOKAHEAD_TEST_THREADS", "1"))
torch.set_num_threads(_TEST_THREADS)


@pytest.fixture(scope="session", autouse=True)
def _user_cache(tmp_path_factory):
    """Calibrations and converted weights go to a folder of the test run, never the user's cache."""
    os.environ["LOOKAHEAD_CACHE"] = str(tmp_path_factory.mktemp("lookahead-cache"))


@pytest.fixture(scope="session")
def tiny_models():
    cache = {}

    def get(arch: str):
        from lookahead.cost import set_cost_curve

        if arch not in cache:
            cache[arch] = tiny_model(arch)
        # a pinned curve, which no step's timing moves (only a learned curve learns): the budget's
        # choices, and so every call count a test asserts, are the same on any machine and under any load.
        set_cost_curve(cache[arch], TINY_COST_CURVE)
        return cache[arch]

    return get


@pytest.fixture(autouse=True)
def _threads_for_real_model(request):
    if request.node.get_closest_marker("smollm") is None:
        yield
        return
    torch.set_num_threads(_ALL_THREADS)
    yield
    torch.set_num_threads(_TEST_THREADS)


@pytest.fixture(scope="session")
def smollm():
    """(model, tokenizer) of the bundled SmolLM2-135M-Instruct, fp32 on the CPU."""
    from lookahead.tools.models import load_smollm2, smollm2_location

    try:
        smollm2_location()
    except RuntimeError as err:
        pytest.skip(f"SmolLM2 not installed ({err}); the set-up script `bash .ci/install test` installs it")

    return load_smollm2()
