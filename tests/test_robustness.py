"""Bad input and concurrency: each case against what plain ``generate`` does for the same input.

The rule: where plain greedy ``generate`` succeeds, the decoder returns the same tokens, or refuses
up front with a clear error when it cannot decode exactly (documented per case below); where plain
``generate`` fails, the decoder fails the same way.

Decisions pinned here:

- ``max_new_tokens=0``, a prompt at ``max_length``, unknown kwargs: ``generate`` itself raises before
  the decoder runs; same error, same message.
- A prompt at the model's maximum length: same tokens as plain (RoPE models), or the same error as
  plain (learned positions, GPT-2); window rows never reach positions plain ``generate`` would not.
- Caches that cannot be rolled back (``cache_implementation="static"`` or any other non-dynamic one, a
  ``StaticCache`` passed in, quantized layers, recurrent state such as Mamba; a sliding window shorter than
  ``max_length`` is decoded past, ``tests/test_sliding.py``)
  and encoder-decoder models: a clear ``ValueError``
  (``CacheNotRollbackable`` for caches) before any forward pass. An explicit decoder never silently
  falls back; ``lookahead.enable(model, default=...)`` falls back to plain ``generate`` with one warning.
- ``output_attentions`` / ``output_hidden_states``: refused (the decoder returns neither).
- Threads: a second concurrent call on one decoder raises ``RuntimeError``; decoders in two threads
  sharing one ``store=`` both decode exactly, and the store ends up as if they had run one after
  the other.
"""

from __future__ import annotations

import sys
import threading
import warnings

import numpy as np
import pytest
import torch
import transformers as tf
from test_trie import _check_invariants  # pytest puts tests/ on sys.path
from transformers import StaticCache, StoppingCriteria, StoppingCriteriaList

import lookahead
from lookahead import LookaheadConfig, LookaheadDecoder
from lookahead._tuning import Tuning
from lookahead.cache import NgramTrie
from lookahead.compat import cache_kwarg_name
from lookahead.kv import CacheNotRollbackable

PROMPT = [3, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11]
IDS = torch.tensor([PROMPT])


def _outcome(fn):
    """("ok", token list) or ("error", exception type, message) of ``fn()``."""
    try:
        out = fn()
    except Exception as err:  # noqa: BLE001 - the type and message are what is compared
        return ("error", type(err), str(err))
    return ("ok", (out if isinstance(out, torch.Tensor) else out.sequences).tolist())


def _plain_and_ours(model, ids=IDS, decoder=None, **kw):
    plain = _outcome(lambda: model.generate(ids, do_sample=False, **kw))
    ours = _outcome(lambda: model.generate(ids, custom_generate=decoder or LookaheadDecoder(), **kw))
    return plain, ours


class _CountForwards:
    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        self.n += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


# -- config --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("window", -1), ("window", 129), ("window", "wide"), ("max_draft_tokens", -1), ("max_draft_tokens", True),
        ("cost_curve", ((0, 1.0),)), ("cost_curve", "fast"),
    ],
)
def test_invalid_config_values_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"LookaheadConfig.{field}="):
        LookaheadConfig(**{field: value})
    with pytest.raises(ValueError, match=f"LookaheadConfig.{field}="):
        LookaheadDecoder(**{field: value})


@pytest.mark.parametrize(
    "field, value",
    [("window_ngram", 1), ("window_candidates", -3), ("adaptive", "yes"), ("trie_capacity", 2.0), ("max_match", -1),
     ("linear_layout", "fast")],
)
def test_invalid_tuning_values_are_refused_naming_the_field(field, value):
    """The old config knobs are the private ``Tuning``'s fields now, validated as before."""
    with pytest.raises(ValueError, match=f"Tuning.{field}="):
        Tuning(**{field: value})


def test_unknown_decoder_options_and_bad_store_are_refused():
    with pytest.raises(TypeError, match="tree_size"):
        LookaheadDecoder(tree_size=3)
    for old in ("trie", "window_width", "step_nodes", "tree_nodes", "adaptive", "calibrations", "clock"):
        with pytest.raises(TypeError, match=old):  # the old spellings: renamed, or a field of the private Tuning
            LookaheadDecoder(**{old: None})
    with pytest.raises(TypeError, match="NgramTrie"):
        LookaheadDecoder(store=NgramTrie)  # the class, not an instance
    with pytest.raises(TypeError, match="Tuning"):
        LookaheadDecoder(_tuning=dict(adaptive=False))


# -- lengths ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [dict(max_new_tokens=0), dict(max_length=len(PROMPT)),
                                dict(max_length=len(PROMPT) - 2)])
def test_nothing_to_generate_behaves_as_plain_generate(tiny_models, kw):
    plain, ours = _plain_and_ours(tiny_models("llama"), eos_token_id=None, **kw)
    assert plain[0] == "error" and ours == plain  # transformers refuses these itself, before the decoder


def test_prompt_at_the_models_maximum_length(tiny_models):
    llama = tiny_models("llama")  # RoPE: plain generate runs past max_position_embeddings (with a warning)
    at_max = torch.tensor([(PROMPT * 40)[:512]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain, ours = _plain_and_ours(llama, at_max, max_new_tokens=6, eos_token_id=None)
    assert plain[0] == "ok" and ours == plain
    gpt2 = tiny_models("gpt2")  # learned positions: plain generate fails, so do we, the same way
    plain, ours = _plain_and_ours(gpt2, at_max, max_new_tokens=3, eos_token_id=None)
    assert plain[0] == "error" and (ours[0], ours[1]) == (plain[0], plain[1])


@pytest.mark.parametrize("length, new", [(500, 12), (511, 1)])
def test_window_rows_stay_within_the_positions_plain_generate_uses(tiny_models, length, new):
    """GPT-2 has 512 learned positions: prompt + new tokens fit, but a window row past them would not."""
    gpt2 = tiny_models("gpt2")
    ids = torch.tensor([(PROMPT * 40)[:length]])
    dec = LookaheadDecoder(window=6, _tuning=Tuning(window_ngram=5, adaptive=False))
    plain, ours = _plain_and_ours(gpt2, ids, decoder=dec, max_new_tokens=new, eos_token_id=None)
    assert plain[0] == "ok" and ours == plain


def test_eos_as_the_first_generated_token(tiny_models):
    model = tiny_models("llama")
    first = model.generate(IDS, do_sample=False, max_new_tokens=1, eos_token_id=None)[0, -1].item()
    memory = NgramTrie(max_n=4, capacity=1024)
    memory.insert([first, 5, 6, 7])  # a store that drafts past the EOS
    kw = dict(max_new_tokens=20, eos_token_id=first, return_dict_in_generate=True, output_scores=True)
    plain = model.generate(IDS, do_sample=False, **kw)
    ours = model.generate(IDS, custom_generate=LookaheadDecoder(store=memory), **kw)
    assert ours.sequences.tolist() == plain.sequences.tolist() == [PROMPT + [first]]
    assert len(ours.scores) == len(plain.scores) == 1


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("padded", [False, True])
def test_all_ones_and_left_padded_masks_with_a_shared_store(tiny_models, arch, padded):
    model = tiny_models(arch)
    ids = torch.tensor([[0, 0, 0] + PROMPT]) if padded else IDS
    mask = (ids != 0).long() if padded else torch.ones_like(ids)
    if padded:
        mask[0, 3:] = 1
    memory = NgramTrie(max_n=5, capacity=2048)
    kw = dict(attention_mask=mask, max_new_tokens=30, eos_token_id=None)
    plain = model.generate(ids, do_sample=False, **kw)
    for _ in range(2):  # the second call drafts from the store
        dec = LookaheadDecoder(store=memory, _tuning=Tuning(adaptive=False))
        assert model.generate(ids, custom_generate=dec, **kw).tolist() == plain.tolist()
    assert dec.stats.accepted_by_origin["memory"] > 0


def test_unknown_kwargs_behave_as_in_plain_generate(tiny_models):
    plain, ours = _plain_and_ours(tiny_models("llama"), max_new_tokens=3, not_an_argument=1)
    assert plain[0] == "error" and ours == plain and "not_an_argument" in plain[2]


def test_outputs_the_decoder_cannot_return_are_refused(tiny_models):
    with pytest.raises(ValueError, match="output_hidden_states"):
        tiny_models("llama").generate(IDS, custom_generate=LookaheadDecoder(), max_new_tokens=3,
                                      return_dict_in_generate=True, output_hidden_states=True)


# -- caches and models the decoder cannot roll back ---------------------------------------------------


@pytest.mark.parametrize("impl", ["offloaded_static", "offloaded"])
def test_offloaded_cache_implementations_are_refused_before_any_forward(tiny_models, impl):
    """(``"static"`` and its older names decode: ``tests/test_static.py``.) Plain ``generate`` offloads to a GPU's
    host memory, so it is not run here."""
    model = tiny_models("llama")
    with _CountForwards(model) as fw, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' deprecation notes on some names
        with pytest.raises(CacheNotRollbackable, match=f"cache_implementation='{impl}'"):
            model.generate(IDS, custom_generate=LookaheadDecoder(), max_new_tokens=5, cache_implementation=impl)
    assert fw.n == 0


def test_cache_implementation_that_generate_maps_to_dynamic_decodes(tiny_models):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain, ours = _plain_and_ours(tiny_models("llama"), max_new_tokens=12, cache_implementation="hybrid",
                                      eos_token_id=None)
    assert plain[0] == "ok" and ours == plain  # transformers 5 turns "hybrid" into a DynamicCache


def test_a_sliding_window_static_cache_decodes_and_one_written_already_is_continued(tiny_models):
    """A new static cache of sliding-window layers (mistral's) decodes: its layers are given the cache's length
    before the first forward (``tests/test_sliding.py``). One an earlier call wrote into holds a window's columns in a
    ring: its tokens are adopted at their own columns, and the call continues it as plain ``generate`` does."""
    import copy

    model = tiny_models("mistral")
    kw = cache_kwarg_name(model)  # `cache` or (5.17) `past_key_values`
    plain = model.generate(IDS, max_new_tokens=5, do_sample=False, **{kw: StaticCache(config=model.config,
                                                                                       max_cache_len=64)})
    ours = model.generate(IDS, custom_generate=LookaheadDecoder(), max_new_tokens=5,
                          **{kw: StaticCache(config=model.config, max_cache_len=64)})
    assert ours.tolist() == plain.tolist()
    written = StaticCache(config=model.config, max_cache_len=64)
    first = model.generate(IDS, max_new_tokens=2, do_sample=False, **{kw: written})
    again = copy.deepcopy(written)
    plain = model.generate(first, max_new_tokens=5, do_sample=False, **{kw: again})
    ours = model.generate(first, custom_generate=LookaheadDecoder(), max_new_tokens=5, do_sample=False,
                          **{kw: written})
    assert ours.tolist() == plain.tolist()
    assert [type(layer) for layer in written.layers] == [type(layer) for layer in again.layers]


def test_quantized_layers_are_refused():
    from transformers.cache_utils import DynamicCache, QuantoQuantizedLayer

    from lookahead.checks import check_cache_layers as _check_cache_layers

    cache = DynamicCache()
    cache.layers = [QuantoQuantizedLayer.__new__(QuantoQuantizedLayer)]  # (no quantization backend needed)
    with pytest.raises(CacheNotRollbackable, match="QuantoQuantizedLayer"):
        _check_cache_layers(cache)


def test_quantized_cache_implementation_behaves_as_plain_or_is_refused(tiny_models):
    plain, ours = _plain_and_ours(tiny_models("llama"), max_new_tokens=3, cache_implementation="quantized")
    if plain[0] == "error":  # no quantization backend installed: generate fails before the decoder runs
        assert (ours[0], ours[1]) == (plain[0], plain[1])
    else:
        assert ours[0] == "error" and ours[1] is CacheNotRollbackable


def test_stateful_model_is_refused_before_any_forward():
    torch.manual_seed(0)
    model = tf.MambaForCausalLM(tf.MambaConfig(vocab_size=96, hidden_size=16, num_hidden_layers=1, state_size=4,
                                               expand=2, conv_kernel=2)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _outcome(lambda: model.generate(IDS, do_sample=False, max_new_tokens=3))[0] == "ok"
        with _CountForwards(model) as fw:
            with pytest.raises(CacheNotRollbackable, match="LinearAttentionLayer"):
                model.generate(IDS, custom_generate=LookaheadDecoder(), max_new_tokens=3)
    assert fw.n == 0


def test_hybrid_model_with_linear_attention_layers_is_refused_before_any_forward():
    """A model mixing convolution (recurrent-state) layers with attention (LFM2): transformers 5.25 calls every
    linear-attention cache layer croppable, but a draft tree's rejected rows cannot be taken back out of its state;
    the decoder refuses it before any forward, on every supported transformers."""
    torch.manual_seed(0)
    model = tf.Lfm2ForCausalLM(tf.Lfm2Config(vocab_size=96, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                             num_attention_heads=2, num_key_value_heads=1, conv_L_cache=3,
                                             layer_types=["conv", "full_attention"])).eval()
    assert _outcome(lambda: model.generate(IDS, do_sample=False, max_new_tokens=3))[0] == "ok"
    with _CountForwards(model) as fw:
        with pytest.raises(CacheNotRollbackable, match="LinearAttentionLayer"):
            model.generate(IDS, custom_generate=LookaheadDecoder(), max_new_tokens=3)
    assert fw.n == 0


def test_encoder_decoder_model_is_refused():
    model = tf.T5ForConditionalGeneration(tf.T5Config(vocab_size=96, d_model=16, d_ff=32, num_layers=1, num_heads=2,
                                                      d_kv=8, decoder_start_token_id=0)).eval()
    assert _outcome(lambda: model.generate(IDS, do_sample=False, max_new_tokens=3))[0] == "ok"
    with pytest.raises(ValueError, match="encoder-decoder"):
        model.generate(IDS, custom_generate=LookaheadDecoder(), max_new_tokens=3)


@pytest.fixture(scope="module")
def windowed():
    """A Mistral with a 40-token sliding window."""
    torch.manual_seed(0)
    cfg = tf.MistralConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=40,
                           max_position_embeddings=512)
    return tf.MistralForCausalLM(cfg).eval().to(torch.float64)


@pytest.mark.parametrize("kw", [dict(), dict(window=4, _tuning=Tuning(tree_nodes=20, adaptive=False))])
def test_sliding_window_up_to_its_length_is_exact(windowed, kw):
    """Up to the window, the same tokens; drafts are cut so that no forward reaches the window."""
    plain, ours = _plain_and_ours(windowed, decoder=LookaheadDecoder(**kw), max_new_tokens=40 - len(PROMPT),
                                  eos_token_id=None)
    assert plain[0] == "ok" and ours == plain


def test_a_batch_up_to_the_window_is_exact_and_its_last_steps_are_narrowed(windowed):
    """Two left-padded rows decoded up to the 40-token window: near its end the batch re-aligns its rows and cuts
    each draft to the columns left below the window (``Padded.fit_kv_window``), so no forward reaches it."""
    ids = torch.tensor([PROMPT, [0, 0, 0] + [(7 * i) % 90 + 3 for i in range(len(PROMPT) - 3)]])
    mask = (ids != 0).long()  # the rows accept different counts, so the batch's columns get holes
    kw = dict(attention_mask=mask, pad_token_id=0, max_new_tokens=40 - len(PROMPT), eos_token_id=None)
    decoder = LookaheadDecoder(window=4, _tuning=Tuning(tree_nodes=20, adaptive=False))
    plain, ours = _plain_and_ours(windowed, ids, decoder, **kw)
    assert plain[0] == "ok" and ours == plain
    assert decoder.stats.target_calls < kw["max_new_tokens"]


def test_sliding_window_shorter_than_max_length_decodes(windowed):
    """Past the window a row and a batch decode exactly (``tests/test_sliding.py``)."""
    plain, ours = _plain_and_ours(windowed, max_new_tokens=60 - len(PROMPT), eos_token_id=None)
    assert plain[0] == "ok" and ours == plain


def test_enabled_default_falls_back_to_plain_with_one_warning(tiny_models):
    model = tiny_models("qwen2")
    kw = dict(max_new_tokens=5, num_beams=2, do_sample=False, eos_token_id=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = model.generate(IDS, **kw)
    lookahead.enable(model, default=LookaheadDecoder())
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = model.generate(IDS, **kw)
    finally:
        lookahead.disable(model)
    ours = [w for w in caught if "lookahead" in str(w.message)]
    assert len(ours) == 1 and "num_beams=2" in str(ours[0].message)
    assert out.tolist() == plain.tolist()


# -- threads ---------------------------------------------------------------------------------------


class _Hold(StoppingCriteria):
    """Blocks the first check until released (so a call is certainly running)."""

    def __init__(self):
        self.running, self.release = threading.Event(), threading.Event()

    def __call__(self, input_ids, scores, **kwargs):
        self.running.set()
        self.release.wait(30)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def test_second_concurrent_call_on_one_decoder_is_refused(tiny_models):
    model = tiny_models("llama")
    dec = LookaheadDecoder(_tuning=Tuning(adaptive=False))
    plain = model.generate(IDS, do_sample=False, max_new_tokens=20, eos_token_id=None)
    hold = _Hold()
    result = {}

    def first():
        result["out"] = model.generate(IDS, custom_generate=dec, max_new_tokens=20, eos_token_id=None,
                                       stopping_criteria=StoppingCriteriaList([hold]))

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert hold.running.wait(30)
        with pytest.raises(RuntimeError, match="already decoding.*one LookaheadDecoder per concurrent"):
            model.generate(IDS, custom_generate=dec, max_new_tokens=5, eos_token_id=None)
    finally:
        hold.release.set()
        thread.join(60)
    assert result["out"].tolist() == plain.tolist()  # the running call was not disturbed
    again = model.generate(IDS, custom_generate=dec, max_new_tokens=20, eos_token_id=None)
    assert again.tolist() == plain.tolist()  # and the decoder is free again


class _Lockstep(StoppingCriteria):
    """Both threads meet at every emitted token, so their steps interleave."""

    def __init__(self, barrier):
        self.barrier = barrier

    def __call__(self, input_ids, scores, **kwargs):
        try:
            self.barrier.wait(timeout=30)
        except threading.BrokenBarrierError:
            pass  # the other thread is done
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def _counts(trie):
    return {k: v[0] for k, v in trie.ngrams().items()}


def test_two_threads_share_one_store_correctly(tiny_models):
    model = tiny_models("llama")
    prompts = [torch.tensor([PROMPT]), torch.tensor([[5, 6, 7, 8, 60, 61, 62, 63, 5, 6, 7, 8, 60, 61]])]
    kw = dict(max_new_tokens=36, eos_token_id=None)
    plain = [model.generate(p, do_sample=False, **kw) for p in prompts]
    memory = NgramTrie(max_n=4, capacity=1 << 12)
    memory.insert([1, 2, 3])  # the main thread's stream, left open
    barrier = threading.Barrier(2)
    out, errors = [None, None], []

    def run(i):
        try:
            dec = LookaheadDecoder(store=memory, _tuning=Tuning(adaptive=False))
            out[i] = model.generate(prompts[i], custom_generate=dec, **kw,
                                    stopping_criteria=StoppingCriteriaList([_Lockstep(barrier)]))
        except Exception as err:  # noqa: BLE001
            errors.append(err)
        finally:
            barrier.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert [o.tolist() for o in out] == [p.tolist() for p in plain]
    # the store: each request its own stream, no n-gram across the two; the same as one after the other
    reference = NgramTrie(max_n=4, capacity=1 << 12)
    reference.insert([1, 2, 3])
    for p in plain:
        reference.reset_stream()
        reference.insert(p[0, len(PROMPT) if p is plain[0] else prompts[1].shape[1]:].numpy())
    assert _counts(memory) == _counts(reference)
    _check_invariants(memory)
    memory.insert([4])  # the main thread's stream is still open: (1, 2, 3, 4) is recorded
    assert (1, 2, 3, 4) in memory.ngrams()


def _thread_streams(seed, n_threads, vocab_per_thread):
    """Per thread: a list of streams (each a list of chunks), over its own range of token ids."""
    rng = np.random.default_rng(seed)
    plans = []
    for t in range(n_threads):
        lo = t * vocab_per_thread
        streams = [[(lo + rng.integers(0, vocab_per_thread, int(rng.integers(1, 9)))).astype(np.int64)
                    for _ in range(int(rng.integers(3, 25)))] for _ in range(int(rng.integers(2, 5)))]
        plans.append(streams)
    return plans


def _hammer(trie, plans, tmp_path=None):
    errors = []
    start = threading.Barrier(len(plans))

    def work(t):
        rng = np.random.default_rng(100 + t)
        try:
            start.wait(30)
            for s, stream in enumerate(plans[t]):
                trie.reset_stream()
                for chunk in stream:
                    trie.insert(chunk)
                    trie.propose(chunk[-2:], 8, 4)
                if tmp_path is not None and rng.random() < 0.5:
                    trie.save(tmp_path / f"t{t}-{s}")
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(len(plans))]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors


def test_threads_hammering_one_trie_get_their_own_streams(tmp_path):
    plans = _thread_streams(0, n_threads=4, vocab_per_thread=6)
    trie = NgramTrie(max_n=4, capacity=1 << 14)
    _hammer(trie, plans, tmp_path)
    reference = NgramTrie(max_n=4, capacity=1 << 14)
    for streams in plans:
        for stream in streams:
            reference.reset_stream()
            for chunk in stream:
                reference.insert(chunk)
    assert trie.n_evictions == 0 and _counts(trie) == _counts(reference)
    _check_invariants(trie)
    for saved in tmp_path.iterdir():  # every snapshot taken meanwhile is a consistent store
        _check_invariants(NgramTrie.load(saved))


@pytest.mark.parametrize("capacity", [36, 150])  # 36: evicting all the time, also below parked streams
def test_threads_under_eviction_never_mix_streams(capacity):
    plans = _thread_streams(1, n_threads=3, vocab_per_thread=5)
    trie = NgramTrie(max_n=3, capacity=capacity)
    _hammer(trie, plans)
    assert trie.n_evictions > 0
    _check_invariants(trie)
    for gram in trie.ngrams():  # each n-gram within one thread's id range: no n-gram spans two streams
        assert len({tok // 5 for tok in gram}) == 1, gram


def _in_thread(fn):
    """Run ``fn`` in a fresh thread (so in a stream of its own) and wait for it."""
    th = threading.Thread(target=fn)
    th.start()
    th.join(60)


def test_eviction_keeps_a_parked_streams_open_path():
    # max_n 3, capacity 36. The main thread writes 1 2 3 (steps 1-3), then parks; another thread
    # writes 100, 101, ..., 110 (steps 4-14) until 36 nodes live. The main thread's next token
    # evicts. The usual threshold, min(9th smallest last_used = 5, s - 2 max_n = 8) = 5, would
    # keep 36 nodes: everything from step 6 on with ancestors, and the main thread's open path
    # (3), (2, 3), (1, 2, 3) with ancestors, which must stay because 4 extends it. So the
    # threshold rises to s - 2 max_n = 8: the other stream keeps its n-grams ending at 105..110
    # and their ancestors (103), (103, 104), (104).
    trie = NgramTrie(max_n=3, capacity=36)
    trie.insert([1, 2, 3])

    def fill():
        for tok in range(100, 111):
            trie.insert([tok])

    _in_thread(fill)
    assert len(trie) == 36 and trie.n_evictions == 0
    trie.insert([4])
    assert trie.n_evictions == 1
    _check_invariants(trie)
    main = {(1,), (2,), (3,), (4,), (1, 2), (2, 3), (3, 4), (1, 2, 3), (2, 3, 4)}
    other = {(103,), (104,), (103, 104)} | {g for t in range(105, 111)
                                            for g in [(t,), (t - 1, t), (t - 2, t - 1, t)]}
    assert set(trie.ngrams()) == main | other


def _round_robin(trie, plans):
    """Each thread inserts one chunk per turn, threads in a fixed order: every chunk switches
    streams, and the interleaving is the same on every run."""
    turn = [0]
    cond = threading.Condition()
    live = list(range(len(plans)))
    errors = []

    def work(t):
        try:
            for stream in plans[t]:
                first = True
                for chunk in stream:
                    with cond:
                        assert cond.wait_for(lambda: live[turn[0]] == t, 30)
                        if first:
                            trie.reset_stream()
                            first = False
                        trie.insert(chunk)
                        turn[0] = (turn[0] + 1) % len(live)
                        cond.notify_all()
        except Exception as err:  # noqa: BLE001
            errors.append(err)
        finally:
            with cond:  # leave the rotation
                i = live.index(t)
                live.pop(i)
                if live:
                    turn[0] = turn[0] - 1 if i < turn[0] else turn[0] % len(live)
                cond.notify_all()

    threads = [threading.Thread(target=work, args=(t,)) for t in range(len(plans))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("max_n", [3, 4])
def test_interleaved_streams_at_minimum_capacity(seed, max_n):
    plans = _thread_streams(seed, n_threads=4, vocab_per_thread=5)
    trie = NgramTrie(max_n=max_n, capacity=4 * max_n * max_n)
    _round_robin(trie, plans)
    assert trie.n_evictions > 0
    _check_invariants(trie)
    reference = NgramTrie(max_n=max_n, capacity=1 << 14)  # every n-gram of every stream, no eviction
    for streams in plans:
        for stream in streams:
            reference.reset_stream()
            for chunk in stream:
                reference.insert(chunk)
    ref = _counts(reference)
    for gram, count in _counts(trie).items():  # only real n-grams of one stream, never over-counted
        assert gram in ref and count <= ref[gram], gram


def test_a_dynamically_quantized_model_is_said_to_decode_differently():
    """quantize_dynamic's linear layers scale a forward's activations by all of its rows, so a verified draft's rows
    come out a little differently from plain's one-row forwards: the decoder says so (a warning naming the layers);
    a float model gets no such warning."""
    from lookahead.decoder import row_dependent_layers

    from tiny import tiny_model

    model = tiny_model("llama").float()
    ids = torch.tensor([PROMPT])
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        model.generate(ids, custom_generate=LookaheadDecoder(), max_new_tokens=4)
    assert not any("dynamically quantized" in str(w.message) for w in said)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own deprecation of its quantized tensors
        quantized = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    assert row_dependent_layers(quantized) == ("Linear",) and row_dependent_layers(model) == ()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        out = quantized.generate(ids, custom_generate=LookaheadDecoder(), max_new_tokens=4)
    assert out.shape == (1, len(PROMPT) + 4)
    messages = [str(w.message) for w in said if "dynamically quantized" in str(w.message)]
    assert len(messages) == 1 and "(Linear, from torch.ao.quantization.quantize_dynamic)" in messages[0]
