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
from lookahead.corpus import DraftCorpus, store_capacity
from lookahead.cost import set_cost_curve
from lookahead.heads import fingerprint

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
