"""A model's own writing as drafts (``lookahead.corpus``): the corpus and its files, its read-only store, the
decoder with a corpus (greedy identical to plain, single rows and batches, fewer calls where the model repeats
what it wrote), the model check, and ``build-corpus`` on a tiny model.

Every model is a tiny random one built from a config (``tiny.py``); cost curves are pinned.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lookahead import LookaheadDecoder, NgramTrie
from lookahead.corpus import DraftCorpus, fingerprint, store_capacity
from lookahead.cost import set_cost_curve

from tiny import TINY_COST_CURVE, tiny_model


@pytest.fixture(scope="module")
def llama():
    model = tiny_model("llama")
    set_cost_curve(model, TINY_COST_CURVE)
    return model


def _greedy(model, prompt: torch.Tensor, new: int) -> torch.Tensor:
    return model.generate(prompt, max_new_tokens=new, do_sample=False, pad_token_id=0)


def _prompt(seed: int, n: int = 8) -> torch.Tensor:
    return torch.randint(3, 96, (1, n), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------- the corpus


def test_streams_keep_their_bounds_in_the_store():
    corpus = DraftCorpus.from_streams([[5, 6, 7], [5, 6, 9]])
    assert (len(corpus), corpus.streams) == (6, 2)
    assert corpus.tokens.tolist() == [5, 6, 7, 5, 6, 9] and corpus.lengths.tolist() == [3, 3]
    store = corpus.shared_store()
    tokens, parents = store.propose([1, 5, 6], max_nodes=8, max_depth=4)
    assert sorted(tokens.tolist()) == [7, 9] and parents.tolist() == [-1, -1]
    assert (7, 5) not in store.ngrams()  # no n-gram spans two streams
    assert store.propose([7], max_nodes=8, max_depth=4)[0].size == 0
    assert corpus.shared_store() is store  # built once, then shared


def test_insert_into_a_store_of_ones_own():
    trie = NgramTrie(max_n=4, capacity=1024)
    DraftCorpus.from_streams([[1, 2, 3], [1, 2, 4]]).insert_into(trie)
    assert set(trie.ngrams()) >= {(1, 2, 3), (1, 2, 4)} and (3, 1) not in trie.ngrams()
    with pytest.raises(TypeError, match="NgramTrie"):
        DraftCorpus.from_streams([[1]]).insert_into({})


def test_store_capacity_examples():
    assert store_capacity(1000) == 1 << 16
    assert store_capacity(100_000) == 1 << 20
    assert store_capacity(0) == 1 << 16


@pytest.mark.parametrize("tokens, lengths, field", [
    (np.array([[1, 2]]), [2], "tokens"),
    ([1, -2], [2], "tokens"),
    ([1.5, 2.0], [2], "tokens"),
    ([1, 2, 3], [2], "lengths"),
    ([1, 2], [[2]], "lengths"),
])
def test_bad_arrays_are_refused_naming_the_field(tokens, lengths, field):
    with pytest.raises(ValueError, match=field):
        DraftCorpus(tokens, lengths)


def test_save_load_round_trip_and_damage(llama, tmp_path):
    corpus = DraftCorpus.from_streams([[3, 4, 5, 6], [7, 8], []], llama, {"data": "hand-written"})
    corpus.save(str(tmp_path))
    again = DraftCorpus.load(str(tmp_path), model=llama)
    assert again.tokens.tolist() == [3, 4, 5, 6, 7, 8] and again.lengths.tolist() == [4, 2, 0]
    assert again.target == fingerprint(llama) and again.described == {"data": "hand-written"}
    header = json.loads((tmp_path / "corpus.json").read_text())
    assert header["format"] == "lookahead-draft-corpus" and header["tokens"] == 6 and header["streams"] == 3
    with np.load(tmp_path / "corpus.npz") as data:
        assert data["tokens"].dtype == np.uint16  # a vocabulary under 65536 ids: two bytes a token
    np.savez_compressed(tmp_path / "corpus.npz", tokens=np.array([3, 4, 5, 9, 7, 8], np.uint16),
                        lengths=np.array([4, 2, 0]))
    with pytest.raises(ValueError, match="do not match"):
        DraftCorpus.load(str(tmp_path))
    header["version"] = 99
    (tmp_path / "corpus.json").write_text(json.dumps(header))
    with pytest.raises(ValueError, match="upgrade lookahead"):
        DraftCorpus.load(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="build-corpus"):
        DraftCorpus.load(str(tmp_path / "nowhere"))


# ------------------------------------------------------------------------------------------- decoding


def test_a_corpus_of_the_models_own_answers_saves_calls_and_stays_identical(llama):
    """The corpus holds the model's greedy answers to some prompts; asked one of them again, a fresh decoder
    drafts the answer from the corpus: far fewer target calls, the same tokens."""
    prompts = [_prompt(seed) for seed in range(4)]
    answers = [_greedy(llama, p, 40)[0, p.shape[1]:] for p in prompts]
    corpus = DraftCorpus.from_streams(answers, llama)
    calls = {"without": 0, "with": 0}
    for prompt in prompts:
        plain = _greedy(llama, prompt, 40)
        without = LookaheadDecoder()
        assert torch.equal(llama.generate(prompt, max_new_tokens=40, custom_generate=without, pad_token_id=0), plain)
        with_corpus = LookaheadDecoder(corpus=corpus)
        ours = llama.generate(prompt, max_new_tokens=40, custom_generate=with_corpus, pad_token_id=0)
        assert torch.equal(ours, plain)
        assert with_corpus.stats.accepted_by_origin["corpus"] >= 5
        assert with_corpus.stats.target_calls < without.stats.target_calls
        calls["without"] += without.stats.target_calls
        calls["with"] += with_corpus.stats.target_calls
    assert calls["with"] < 0.75 * calls["without"]
    other = _prompt(99)  # a prompt the corpus knows nothing of: drafts may be wrong, the output is not
    assert torch.equal(llama.generate(other, max_new_tokens=40, custom_generate=LookaheadDecoder(corpus=corpus),
                                      pad_token_id=0), _greedy(llama, other, 40))


def test_a_batch_with_a_corpus_is_each_rows_plain_output(llama):
    prompts = [_prompt(seed) for seed in range(3)]
    corpus = DraftCorpus.from_streams([_greedy(llama, p, 32)[0, 8:] for p in prompts[:2]], llama)
    batch = torch.cat(prompts)
    plain = llama.generate(batch, max_new_tokens=32, do_sample=False, pad_token_id=0)
    decoder = LookaheadDecoder(corpus=corpus)
    ours = llama.generate(batch, max_new_tokens=32, custom_generate=decoder, pad_token_id=0)
    assert torch.equal(ours, plain)
    assert sum(r.accepted_by_origin["corpus"] for r in decoder.row_stats) > 0


def test_a_corpus_of_another_model_is_refused_before_any_forward(llama):
    corpus = DraftCorpus.from_streams([[3, 4, 5]], llama)
    other = tiny_model("llama", seed=99)  # same shapes, other weights
    set_cost_curve(other, TINY_COST_CURVE)
    with pytest.raises(ValueError, match="written by another model"):
        corpus.check_model(other)
    calls = []
    hook = other.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match="build-corpus"):
            other.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=4, pad_token_id=0,
                           custom_generate=LookaheadDecoder(corpus=corpus))
    finally:
        hook.remove()
    assert not calls
    with pytest.raises(TypeError, match="DraftCorpus"):
        LookaheadDecoder(corpus=NgramTrie())


def test_one_corpus_serves_decoders_in_threads(llama):
    """Decoders in several threads draft from one shared store at once; each output is plain's."""
    from concurrent.futures import ThreadPoolExecutor

    prompts = [_prompt(seed) for seed in range(4)]
    corpus = DraftCorpus.from_streams([_greedy(llama, p, 24)[0, 8:] for p in prompts], llama)
    plain = [_greedy(llama, p, 24) for p in prompts]

    def run(p):
        return llama.generate(p, max_new_tokens=24, custom_generate=LookaheadDecoder(corpus=corpus), pad_token_id=0)

    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(run, prompts))
    assert all(torch.equal(a, b) for a, b in zip(outs, plain))


# ------------------------------------------------------------------------------------------- found for the model


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A user cache of this test's own, and what is found per model in it kept apart from other tests."""
    import weakref

    from lookahead import corpus as corpus_module
    from lookahead import kept

    monkeypatch.setenv("LOOKAHEAD_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LOOKAHEAD_PERSIST", raising=False)
    monkeypatch.setattr(kept, "_FOUND", weakref.WeakKeyDictionary())  # what is found here stays here
    monkeypatch.setattr(corpus_module, "_LOADED", {})
    return tmp_path / "cache"


def test_the_default_decoder_drafts_from_the_corpus_installed_for_its_model(llama, own_cache):
    """``build-corpus`` installs a corpus in the user cache; ``LookaheadDecoder()`` (``corpus="auto"``) then
    drafts from it for that model, with the same tokens, and ``corpus=None`` does not."""
    from lookahead.corpus import corpus_for, install_folder

    prompts = [_prompt(seed) for seed in range(3)]
    answers = [_greedy(llama, p, 40)[0, p.shape[1]:] for p in prompts]
    assert corpus_for(llama) is None  # nothing installed yet
    before = LookaheadDecoder()
    plain = _greedy(llama, prompts[0], 40)
    assert torch.equal(llama.generate(prompts[0], max_new_tokens=40, custom_generate=before, pad_token_id=0), plain)
    assert before.corpus is None and before.stats.drafted_by_origin["corpus"] == 0

    corpus = DraftCorpus.from_streams(answers, llama, {"data": "the model's answers"})
    folder = corpus.install()
    assert folder == install_folder(fingerprint(llama)) and folder.startswith(str(own_cache / "corpora"))
    found = corpus_for(llama)
    assert found is not None and found.tokens.tolist() == corpus.tokens.tolist()
    assert corpus_for(llama) is found  # decided once per model, one object (its store built once)

    auto = LookaheadDecoder()
    assert torch.equal(llama.generate(prompts[0], max_new_tokens=40, custom_generate=auto, pad_token_id=0), plain)
    assert auto.corpus is found and auto.stats.accepted_by_origin["corpus"] >= 5
    assert auto.stats.corpus == repr(found) == "DraftCorpus(3 streams, 120 tokens, target=LlamaForCausalLM)"
    assert auto.stats.as_dict()["corpus"] == auto.stats.corpus and before.stats.corpus is None
    assert auto.stats.target_calls < before.stats.target_calls
    off = LookaheadDecoder(corpus=None)
    assert torch.equal(llama.generate(prompts[0], max_new_tokens=40, custom_generate=off, pad_token_id=0), plain)
    assert off.corpus is None and off.stats.drafted_by_origin["corpus"] == 0

    # one decoder, another model of the same shape: no corpus for it, no error, its plain output
    other = tiny_model("llama", seed=99)
    set_cost_curve(other, TINY_COST_CURVE)
    assert corpus_for(other) is None
    assert torch.equal(other.generate(prompts[1], max_new_tokens=24, custom_generate=auto, pad_token_id=0),
                       _greedy(other, prompts[1], 24))
    assert auto.corpus is None and auto.stats.drafted_by_origin["corpus"] == 0 and auto.stats.corpus is None
    # and back: the corpus again
    assert torch.equal(llama.generate(prompts[1], max_new_tokens=40, custom_generate=auto, pad_token_id=0),
                       _greedy(llama, prompts[1], 40))
    assert auto.corpus is found and auto.stats.accepted_by_origin["corpus"] >= 5


def test_a_batch_finds_the_installed_corpus_too(llama, own_cache):
    prompts = [_prompt(seed) for seed in range(2)]
    DraftCorpus.from_streams([_greedy(llama, p, 32)[0, 8:] for p in prompts], llama).install()
    batch = torch.cat(prompts)
    decoder = LookaheadDecoder()
    ours = llama.generate(batch, max_new_tokens=32, custom_generate=decoder, pad_token_id=0)
    assert torch.equal(ours, llama.generate(batch, max_new_tokens=32, do_sample=False, pad_token_id=0))
    assert sum(r.accepted_by_origin["corpus"] for r in decoder.row_stats) > 0


def test_no_corpus_is_found_beside_heads(llama, own_cache):
    from lookahead.heads import DraftHeads

    prompt = _prompt(0)
    DraftCorpus.from_streams([_greedy(llama, prompt, 24)[0, 8:]], llama).install()
    torch.manual_seed(0)
    heads = DraftHeads.for_model(llama, "medusa", 2, torch.arange(96))
    with_heads = LookaheadDecoder(heads=heads)  # "auto" beside heads: none (measured: it added nothing there)
    assert torch.equal(llama.generate(prompt, max_new_tokens=24, custom_generate=with_heads, pad_token_id=0),
                       _greedy(llama, prompt, 24))
    assert with_heads.corpus is None and with_heads.stats.drafted_by_origin["corpus"] == 0


def test_no_corpus_is_found_with_the_cache_off_or_from_a_damaged_file(llama, own_cache, monkeypatch, caplog):
    from lookahead.corpus import DATA_FILE, corpus_for, forget

    prompt = _prompt(0)
    folder = DraftCorpus.from_streams([_greedy(llama, prompt, 24)[0, 8:]], llama).install()

    monkeypatch.setenv("LOOKAHEAD_PERSIST", "0")  # the user cache is not read
    forget()
    assert corpus_for(llama) is None
    monkeypatch.delenv("LOOKAHEAD_PERSIST")
    forget()
    assert corpus_for(llama) is not None

    data = own_cache / "corpora" / folder.rsplit("/", 1)[-1] / DATA_FILE
    whole = data.read_bytes()
    for damaged in (b"not a corpus", whole[: len(whole) // 2]):  # not a zip; a zip cut in half
        data.write_bytes(damaged)
        forget()
        caplog.clear()
        with caplog.at_level("WARNING", logger="lookahead"):
            assert corpus_for(llama) is None  # skipped with a warning, never raised into generate
        assert "skipping the draft corpus" in caplog.text
    decoder = LookaheadDecoder()
    assert torch.equal(llama.generate(prompt, max_new_tokens=24, custom_generate=decoder, pad_token_id=0),
                       _greedy(llama, prompt, 24))


def test_installing_needs_a_corpus_bound_to_a_model_and_the_cache_on(llama, own_cache, monkeypatch):
    with pytest.raises(ValueError, match="bound to a model"):
        DraftCorpus.from_streams([[3, 4, 5]]).install()
    monkeypatch.setenv("LOOKAHEAD_PERSIST", "off")
    with pytest.raises(ValueError, match="LOOKAHEAD_PERSIST"):
        DraftCorpus.from_streams([[3, 4, 5]], llama).install()
    with pytest.raises(TypeError, match='"auto" or None'):
        LookaheadDecoder(corpus="bundled")


def test_the_bundled_corpus_is_found_for_no_tiny_model_without_hashing_it(monkeypatch, own_cache):
    """A model whose shape no kept corpus has is answered from the headers alone: its LM head is never hashed."""
    from lookahead import kept
    from lookahead.corpus import corpus_for
    from lookahead.kept import BUNDLED, kept_corpora

    assert [folder for folder, _ in kept_corpora()] == [BUNDLED]
    model = tiny_model("llama")

    def no_hash(m):
        raise AssertionError("hashed")

    monkeypatch.setattr(kept, "fingerprint", no_hash)
    assert corpus_for(model) is None
    assert kept.find(model, "heads", kept.kept_heads, no_hash) is None  # nor bundled heads


def test_a_copied_decoder_shares_the_corpus_and_its_store(llama, own_cache):
    """``copy.deepcopy`` of a decoder that drafts from a corpus shares the corpus and its built store (read-only,
    about 90 MB for the bundled one) instead of copying them; the copy decodes plain's tokens with it."""
    import copy

    from lookahead.drafting.sources import CorpusSource

    prompt = _prompt(0)
    corpus = DraftCorpus.from_streams([_greedy(llama, prompt, 32)[0, 8:]], llama)
    for decoder in (LookaheadDecoder(corpus=corpus), LookaheadDecoder()):
        if decoder.corpus_setting == "auto":
            corpus.install()
        llama.generate(prompt, max_new_tokens=32, custom_generate=decoder, pad_token_id=0)
        twin = copy.deepcopy(decoder)
        assert twin.corpus is decoder.corpus and twin._corpus_store is decoder._corpus_store is not None
        sources = [s for s in twin.policy.sources if isinstance(s, CorpusSource)]
        assert len(sources) == 1 and sources[0].trie is decoder._corpus_store
        assert torch.equal(llama.generate(prompt, max_new_tokens=32, custom_generate=twin, pad_token_id=0),
                           _greedy(llama, prompt, 32))
        assert twin.stats.accepted_by_origin["corpus"] >= 5


def test_a_pickled_decoder_leaves_the_store_behind_and_binds_it_again(llama, own_cache):
    """A pickle of a decoder that drafted from a corpus (what a worker process of ``multiprocessing`` or
    ``datasets.map(num_proc=...)`` receives) carries the corpus's streams, not its built store, not even inside the
    policy's corpus source (24 MB for the bundled corpus before, 0.75 MB now); unpickled, it drafts from the
    corpus's store again and decodes plain's tokens, for one row and for a batch's row policies."""
    import pickle

    from lookahead.drafting.sources import CorpusSource

    prompt = _prompt(0)
    corpus = DraftCorpus.from_streams([_greedy(llama, prompt, 32)[0, 8:]], llama)
    decoder = LookaheadDecoder(corpus=corpus)
    llama.generate(prompt, max_new_tokens=32, custom_generate=decoder, pad_token_id=0)
    llama.generate(torch.cat([prompt, prompt]), max_new_tokens=4, custom_generate=decoder, pad_token_id=0)
    policies = (decoder.policy, *decoder.row_policies)
    assert len(policies) == 3
    for policy in policies:
        source = next(s for s in policy.sources if isinstance(s, CorpusSource))
        assert pickle.loads(pickle.dumps(source)).trie is None  # the store stays behind
    twin = pickle.loads(pickle.dumps(decoder))
    for policy in (twin.policy, *twin.row_policies):
        source = next(s for s in policy.sources if isinstance(s, CorpusSource))
        assert source.trie is twin._corpus_store is not None
    assert torch.equal(llama.generate(prompt, max_new_tokens=32, custom_generate=twin, pad_token_id=0),
                       _greedy(llama, prompt, 32))
    assert twin.stats.accepted_by_origin["corpus"] >= 5
