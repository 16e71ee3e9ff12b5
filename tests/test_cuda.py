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


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="device_map over two devices needs two GPUs")
def test_device_map_over_two_gpus_is_plain(tmp_path):
    """Layers spread over two GPUs (ids in on the first, logits out on the second): greedy and processed
    (repetition penalty) outputs identical to plain generate's, in fewer forwards than tokens."""
    from transformers import AutoModelForCausalLM

    from lookahead import LookaheadDecoder

    from tiny import tiny_model

    tiny_model("llama", layers=4).save_pretrained(tmp_path)
    device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0, "model.layers.1": 0,
                  "model.layers.2": 1, "model.layers.3": 1, "model.norm": 1, "lm_head": 1}
    model = AutoModelForCausalLM.from_pretrained(tmp_path, device_map=device_map, dtype=torch.float64).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]], device="cuda:0")
    for kw in ({}, {"repetition_penalty": 1.3}):
        plain = model.generate(ids, max_new_tokens=30, do_sample=False, **kw)
        dec = LookaheadDecoder(cost_curve=((1, 0.01), (2, 0.01), (256, 0.0102)))
        ours = model.generate(ids, max_new_tokens=30, do_sample=False, custom_generate=dec, **kw)
        assert ours.tolist() == plain.tolist(), kw
        assert dec.stats.target_calls < 30


def test_static_cache_compiled_with_cuda_graphs_is_plain_and_does_not_recompile():
    """On CUDA a static cache's steps compile as plain generate's do (mode="reduce-overhead", CUDA graphs): the
    same tokens as plain static generate, and a second call replays every bucket's graph."""
    from transformers import StaticCache

    from lookahead import LookaheadDecoder
    from lookahead.compat import cache_kwarg_name

    from tiny import tiny_model

    model = tiny_model("llama").to("cuda")
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]], device="cuda")
    cache = StaticCache(config=model.config, max_cache_len=128)
    name = cache_kwarg_name(model)

    def run(decoder=None):
        cache.reset()
        extra = {"custom_generate": decoder} if decoder is not None else {}
        return model.generate(ids, max_new_tokens=48, do_sample=False, pad_token_id=0, **{name: cache}, **extra)

    plain = run()
    assert run(LookaheadDecoder(adaptive=False)).tolist() == plain.tolist()
    again = LookaheadDecoder(adaptive=False)
    with torch.compiler.set_stance("fail_on_recompile"):
        assert run(again).tolist() == plain.tolist()
    assert again.stats.target_calls < 48
