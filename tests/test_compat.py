"""Every private transformers API the plugin touches (lookahead/compat.py), pinned to the installed version,
and the package's independence from anything generic on ``sys.path``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import transformers
from transformers import StoppingCriteriaList, TextStreamer
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, MaxTimeCriteria

from lookahead import compat


def test_tested_version_is_the_installed_one():
    """compat.py was checked on this transformers; an upgrade must re-check it (and update the constant)."""
    assert transformers.__version__.startswith(compat.TESTED_TRANSFORMERS), (
        f"transformers {transformers.__version__} is installed, compat.py was checked on "
        f"{compat.TESTED_TRANSFORMERS}: re-run tests/test_compat.py and review lookahead/compat.py"
    )


def test_streamer_is_found_in_the_calling_generate_frame(tiny_models):
    model = tiny_models("llama")
    seen = []

    class Spy:
        def __call__(self, model, input_ids, **kwargs):
            seen.append(compat.arguments_of_calling_generate(self, ("streamer",), depth=1)[0])
            return input_ids

    class Recorder(TextStreamer):
        def __init__(self):  # no tokenizer needed: put/end are not called with text here
            self.values = []

        def put(self, value):
            self.values.append(value)

        def end(self):
            pass

    streamer = Recorder()
    spy = Spy()
    model.generate(torch.tensor([[3, 4, 5]]), custom_generate=spy, streamer=streamer, max_new_tokens=2)
    model.generate(torch.tensor([[3, 4, 5]]), custom_generate=spy, max_new_tokens=2)
    assert seen == [streamer, None]


def test_supports_logits_to_keep(tiny_models):
    assert compat.supports_logits_to_keep(tiny_models("llama")) is True


def test_generation_config_for_call(tiny_models):
    config = compat.generation_config_for_call(tiny_models("llama"), None, {"max_new_tokens": 7, "num_beams": 2})
    assert config.max_new_tokens == 7 and config.num_beams == 2


def test_rollbackable_layer_types_and_cache_kwarg(tiny_models):
    from transformers import DynamicCache

    full, sliding = compat.rollbackable_layer_types()
    cache = DynamicCache(config=tiny_models("llama").config)
    assert all(type(layer) in (full, sliding) for layer in cache.layers)
    assert compat.cache_kwarg_name(tiny_models("llama")) in ("cache", "past_key_values")


def test_decoder_only_output_carries_the_cache():
    out = compat.decoder_only_output(torch.zeros(1, 3, dtype=torch.long), None, None, "the-cache")
    assert out.sequences.shape == (1, 3) and "the-cache" in out.values()


def test_host_stopping_splits_what_the_host_can_check():
    eos = EosTokenCriteria(torch.tensor([2, 7]))
    timer = MaxTimeCriteria(max_time=100.0)
    max_length, eos_ids, others = compat.host_stopping(StoppingCriteriaList([MaxLengthCriteria(50), eos, timer]))
    assert max_length == 50 and eos_ids == {2, 7} and others == [timer]
    assert compat.host_stopping(None) == (None, frozenset(), [])


def test_a_users_own_cache_and_benchmarks_packages_do_not_shadow_ours(tmp_path):
    """A working directory with its own ``cache`` and ``benchmarks`` packages (each raising on import):
    ``import lookahead`` and a decode still work, because nothing of ours imports those names."""
    for name in ("cache", "benchmarks"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('the user\\'s own {name} package')\n")
    script = textwrap.dedent("""
        import torch, transformers as tf
        from lookahead import LookaheadDecoder
        cfg = tf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2)
        torch.manual_seed(0)
        model = tf.LlamaForCausalLM(cfg).eval()
        ids = torch.tensor([[3, 10, 11, 12, 10, 11, 12, 10, 11]])
        plain = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
        ours = model.generate(ids, max_new_tokens=12, eos_token_id=None, pad_token_id=0,
                              custom_generate=LookaheadDecoder(cost_curve=((1, 1.0), (64, 1.0))))
        assert torch.equal(plain, ours)
        import sys
        assert "cache" not in sys.modules and "benchmarks" not in sys.modules
        for found in ("lookahead.heads", "lookahead.corpus"):  # "auto" finds none for it, from the headers alone
            assert found not in sys.modules, found
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().endswith("ok")


def test_the_optional_paths_private_api_loads_on_first_use():
    """``compat.NAME`` reaches ``compat_optional``'s names too, importing that module only then."""
    script = textwrap.dedent("""
        import sys
        from lookahead import compat
        assert "lookahead.compat_optional" not in sys.modules
        assert compat.adopt_ring is sys.modules["lookahead.compat_optional"].adopt_ring
        assert not hasattr(compat, "no_such_name") and not hasattr(compat, "__path__")
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


def test_the_decoder_reads_no_private_transformers_api_outside_compat():
    """A transformers upgrade breaks in one place: no module but compat.py and compat_optional.py reaches into
    private names."""
    import pathlib
    import re

    root = pathlib.Path(compat.__file__).parent
    private = re.compile(r"\bmodel\._[a-z]|sys\._getframe|transformers\.[a-z_.]*\._")
    offenders = [f"{p.name}:{i}" for p in root.rglob("*.py") if p.name not in ("compat.py", "compat_optional.py")
                 for i, line in enumerate(p.read_text().splitlines(), 1) if private.search(line)]
    assert offenders == []


def test_processors_as_function_chains_like_the_list():
    from transformers import (
        LogitsProcessorList,
        MinNewTokensLengthLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
    )

    procs = LogitsProcessorList([MinNewTokensLengthLogitsProcessor(3, 2, [7]),
                                 RepetitionPenaltyLogitsProcessor(1.3)])
    ids = torch.tensor([[1, 2, 3, 4]])
    scores = torch.randn(1, 10, generator=torch.Generator().manual_seed(0))
    assert torch.equal(compat.processors_as_function(procs)(ids, scores.clone()), procs(ids, scores.clone()))
    assert compat.processors_as_function(LogitsProcessorList()) is None


def test_the_decoder_sets_no_environment_variable_and_masks_its_steps_of_several_rows(tiny_models):
    """Nothing process-wide changes during a call (the decoder no longer sets ``TRANSFORMERS_SDPA_FORCE_GQA`` around
    its steps: another thread's forward would see it): ``os.environ`` at every forward, and after, is what it was
    before. The prompt's forward (which carries a chain of drafts here) is causal, transformers building its mask;
    after it every step of several rows, a tree's or a chain's, takes the step's 4D mask (on a CPU a chain after one
    pending token does too: ``shapes.OneRow.pack``), and one-row steps none; the tokens are plain generate's."""
    from lookahead import LookaheadDecoder
    from lookahead._tuning import Tuning

    model = tiny_models("llama")
    before = dict(os.environ)
    seen = []

    def spy(module, args, kwargs):
        ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        seen.append((ids.shape[1], mask is not None and mask.dim() == 4, dict(os.environ) == before))

    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8, 9, 5, 6]])
    plain = model.generate(ids, do_sample=False, max_new_tokens=24, eos_token_id=None)
    trees = LookaheadDecoder(_tuning=Tuning(adaptive=False, tree_nodes=3))
    chains = LookaheadDecoder(_tuning=Tuning(adaptive=False, tree_nodes=0, recycle_k=0, copy_branches=1,
                                             fill_nodes=0))  # the copy's
    for decoder in (trees, chains):
        seen.clear()
        handle = model.register_forward_pre_hook(spy, with_kwargs=True)
        try:
            ours = model.generate(ids, custom_generate=decoder, max_new_tokens=24, eos_token_id=None)
        finally:
            handle.remove()
        assert ours.tolist() == plain.tolist()
        prompt, steps = seen[0], seen[1:]
        assert prompt[0] > 1 and not prompt[1]  # causal, several rows
        assert any(rows > 1 and masked for rows, masked, _ in steps) and any(rows == 1 for rows, _, _ in steps)
        assert all(masked == (rows > 1) for rows, masked, _ in steps)  # after the prompt: chains masked too
        assert all(same for _, _, same in seen) and dict(os.environ) == before


needs_grouped = pytest.mark.skipif(not hasattr(compat, "grouped_attention"),
                                   reason="compat.grouped_attention (the shadow's grouped SDPA) is not there")


@needs_grouped
def test_grouped_attention_applies_to_grouped_sdpa_models_on_a_cpu(tiny_models, monkeypatch):
    """The tiny Llama (4 query heads, 2 key/value heads, SDPA) on a CPU; not a model whose heads are not grouped,
    and not eager attention. (The masked-GQA environment variable it replaces is gone.)"""
    llama = tiny_models("llama")
    assert llama.config.num_key_value_heads < llama.config.num_attention_heads
    assert compat.grouped_applies(llama)
    assert not compat.grouped_applies(tiny_models("gpt2"))  # one key/value head per query head
    monkeypatch.setattr(llama.config, "_attn_implementation", "eager")  # (the shared tiny model: undone after)
    assert not compat.grouped_applies(llama)


@needs_grouped
def test_the_grouped_shadow_computes_sdpas_logits_and_leaves_the_model_alone(tiny_models, monkeypatch):
    """A step with a tree's mask through the shadow whose attention hands grouped keys to SDPA as they are (no
    ``repeat_kv``) gives the model's own logits; the model's config and attention modules are untouched."""
    from transformers.integrations import sdpa_attention

    from lookahead.cpu.layouts import LinearPlan
    from lookahead.shadow import shadow

    model = tiny_models("llama")
    configs = [(m, m.config) for m in model.modules() if hasattr(m, "num_key_value_groups")]
    steps = shadow(model, LinearPlan(), grouped=True)
    repeats = []
    original = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda *a: repeats.append(1) or original(*a))
    ids = torch.randint(3, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(1, 1, 4, 12, dtype=torch.float64)
    mask[..., 8:] = torch.triu(torch.full((4, 4), torch.finfo(torch.float64).min, dtype=torch.float64), 1)
    mask[..., 2, 9] = torch.finfo(torch.float64).min  # a tree: row 2 does not see column 9
    logits = []
    with torch.no_grad():
        for runner in (model, steps):
            cache = transformers.DynamicCache(config=model.config)
            model(input_ids=ids[:, :8], use_cache=True, **{compat.cache_kwarg_name(model): cache})
            repeats.clear()
            logits.append(runner(input_ids=ids[:, 8:], position_ids=torch.arange(8, 12)[None], attention_mask=mask,
                                 use_cache=True, **{compat.cache_kwarg_name(model): cache}).logits)
            assert bool(repeats) == (runner is model)
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-12, atol=1e-12)
    assert model.config._attn_implementation == "sdpa"
    assert all(m.config is config for m, config in configs)
