"""The headline checks on a CUDA device (skipped without one).

CI has no GPU, so these skip there with the reason; on a machine with one they run the exactness checks of
``python -m benchmarks.gpu_check --parts tiny,sampling`` (written out here, on the decoder's current settings):
greedy output identical to plain ``generate`` on six tiny float64 architectures (single prompts with four decoders,
and a left-padded batch), and the sampled chi-square of the next two tokens, all drawn on the GPU; then a model
spread over two GPUs, and a static cache compiled with CUDA graphs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lookahead import LookaheadDecoder
from lookahead._tuning import Tuning

from tiny import TINY_ARCHS, peaky_llama, tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the CUDA checks need one")

REPETITIVE = [3, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11]
NO_REPEAT = [3, 41, 7, 88, 19, 64, 2, 53, 30, 77, 9]
BATCH = [[5, 6, 7, 8, 9, 10, 11, 5, 6, 7, 8, 9, 10, 11, 5, 6, 7], [3, 4, 3, 4, 3, 4, 3, 4, 12, 13],
         [20, 21, 22, 23, 24, 25, 26, 20, 21, 22, 23], [40, 41]]
DECODERS = {  # the calibrated budget, the full tree every step, a lookahead window, the widest steps (flat curve)
    "calibrated": {}, "full-tree": {"_tuning": Tuning(adaptive=False)}, "window": {"window": 4},
    "wide": {"cost_curve": "flat"},
}


def _greedy_rows(device: str) -> list[dict]:
    """Per architecture, prompt and decoder, and per architecture's left-padded batch: identical to plain?"""
    rows = []
    for arch in TINY_ARCHS:
        model = tiny_model(arch).to(device)
        for prompt_name, prompt in (("repetitive", REPETITIVE), ("no-repeat", NO_REPEAT)):
            ids = torch.tensor([prompt], device=device)
            plain = model.generate(ids, do_sample=False, max_new_tokens=48, eos_token_id=None).tolist()
            for name, settings in DECODERS.items():
                dec = LookaheadDecoder(**settings)
                ours = model.generate(ids, max_new_tokens=48, eos_token_id=None, custom_generate=dec).tolist()
                rows.append({"arch": arch, "prompt": prompt_name, "decoder": name, "identical": ours == plain,
                             "calls": dec.stats.target_calls})
        width = max(len(p) for p in BATCH)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in BATCH], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in BATCH], device=device)
        kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=32, eos_token_id=None)
        plain = model.generate(do_sample=False, **kw).tolist()
        ours = model.generate(custom_generate=LookaheadDecoder(), **kw).tolist()
        rows.append({"arch": arch, "prompt": "batch", "decoder": "default", "identical": ours == plain})
    return rows


def test_greedy_identical_on_cuda():
    rows = _greedy_rows("cuda")
    assert len(rows) == len(TINY_ARCHS) * (2 * len(DECODERS) + 1)
    bad = [r for r in rows if not r["identical"]]
    assert not bad, f"outputs differ from plain generate on CUDA: {bad}"


def test_sampled_distribution_on_cuda():
    import test_sampling as ts  # pytest puts tests/ on sys.path

    model = peaky_llama(ts.VOCAB)
    exact = ts._exact_two_token_distribution(model, ts.SETTINGS["temperature"])  # on the CPU, by enumeration
    model = model.to("cuda")
    torch.manual_seed(2024)
    dec = LookaheadDecoder(_tuning=ts.FULL_TREE)
    ids = torch.tensor([ts.PROMPT], device="cuda")
    counts = np.zeros((ts.VOCAB, ts.VOCAB))
    drafted = accepted = 0
    for _ in range(ts.N_SAMPLES):
        out = model.generate(ids, custom_generate=dec, do_sample=True, max_new_tokens=2, eos_token_id=None,
                             pad_token_id=0, **ts.SETTINGS["temperature"])
        a, b = out[0, len(ts.PROMPT):].tolist()
        counts[a, b] += 1
        drafted += dec.stats.drafted
        accepted += dec.stats.accepted
    assert 0 < accepted < drafted
    p = ts._pvalue(counts, exact)
    assert p > ts.LEVEL, f"samples do not follow the target distribution on CUDA (p={p:.2e})"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="device_map over two devices needs two GPUs")
def test_device_map_over_two_gpus_is_plain(tmp_path):
    """Layers spread over two GPUs (ids in on the first, logits out on the second): greedy and processed
    (repetition penalty) outputs identical to plain generate's, in fewer forwards than tokens."""
    from transformers import AutoModelForCausalLM

    tiny_model("llama", layers=4).save_pretrained(tmp_path)
    device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0, "model.layers.1": 0,
                  "model.layers.2": 1, "model.layers.3": 1, "model.norm": 1, "lm_head": 1}
    model = AutoModelForCausalLM.from_pretrained(tmp_path, device_map=device_map, dtype=torch.float64).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]], device="cuda:0")
    for kw in ({}, {"repetition_penalty": 1.3}):
        plain = model.generate(ids, max_new_tokens=30, do_sample=False, **kw)
        dec = LookaheadDecoder(cost_curve="flat")
        ours = model.generate(ids, max_new_tokens=30, do_sample=False, custom_generate=dec, **kw)
        assert ours.tolist() == plain.tolist(), kw
        assert dec.stats.target_calls < 30


def test_static_cache_compiled_with_cuda_graphs_is_plain_and_does_not_recompile():
    """On CUDA a static cache's steps compile as plain generate's do (mode="reduce-overhead", CUDA graphs): the
    same tokens as plain static generate, and a second call replays every bucket's graph. The cache goes back as
    transformers made it (its own layer classes) after each call."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    from lookahead.compat import cache_kwarg_name

    model = tiny_model("llama").to("cuda")
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]], device="cuda")
    cache = StaticCache(config=model.config, max_cache_len=128)
    name = cache_kwarg_name(model)

    def run(decoder=None):
        cache.reset()
        extra = {"custom_generate": decoder} if decoder is not None else {}
        return model.generate(ids, max_new_tokens=48, do_sample=False, pad_token_id=0, **{name: cache}, **extra)

    plain = run()
    full = Tuning(adaptive=False)
    assert run(LookaheadDecoder(_tuning=full)).tolist() == plain.tolist()
    assert all(type(layer) is StaticLayer for layer in cache.layers)
    again = LookaheadDecoder(_tuning=full)
    with torch.compiler.set_stance("fail_on_recompile"):
        assert run(again).tolist() == plain.tolist()
    assert again.stats.target_calls < 48
