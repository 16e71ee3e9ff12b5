"""The headline checks on a CUDA device (skipped without one): ``benchmarks/gpu_check.py``'s exactness parts.

CI has no GPU, so these skip there with the reason; on a machine with one they run the same checks as
``python -m benchmarks.gpu_check --parts tiny,sampling``: greedy output identical to plain ``generate`` on six
tiny float64 architectures (single prompts with three decoders, and a left-padded batch), and the sampled
chi-square of the next two tokens, all drawn on the GPU.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks import gpu_check

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the CUDA checks need one")


def test_greedy_identical_on_cuda():
    rows = gpu_check.check_tiny("cuda")
    assert len(rows) == 42
    bad = [r for r in rows if not r["identical"]]
    assert not bad, f"outputs differ from plain generate on CUDA: {bad}"


def test_sampled_distribution_on_cuda():
    (row,) = gpu_check.check_sampling("cuda")
    assert 0 < row["accepted"] < row["drafted"]
    assert row["identical"], f"samples do not follow the target distribution on CUDA (p={row['pvalue']:.2e})"
