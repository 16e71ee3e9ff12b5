"""Draft sources beyond the trie: the longest-match copy (``CopySource``), the model's own predictions
(``ModelSource``, ``recycle.py``), the merge of every source's tree into one draft, the per-step node cap,
and exactness (greedy and sampled) with them on."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
import torch

from lookahead import LookaheadConfig, LookaheadDecoder
from lookahead._tuning import DEFAULT, Tuning
from lookahead.cache import NgramTrie
from lookahead.cost import CostModel
from lookahead.drafting.draft import COPY, FREQUENT, MODEL, ORIGINS, TRIE, Draft
from lookahead.drafting.policy import DraftPolicy, Limits
from lookahead.drafting.recycle import SuccessorTable
from lookahead.drafting.sources import CopySource, FrequentSource, ModelSource, Proposal, merge_proposals
from lookahead.drafting.trees import tree_depth_rank

from draft_reference import build_draft, merge_trees
from tiny import TINY_ARCHS

REPETITIVE = [3, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11]
NO_REPEAT = [3, 41, 7, 88, 19, 64, 2, 53, 30, 77, 9]
FLAT = ((1, 0.010), (2, 0.010), (256, 0.0102))
COPY_HEAVY = {
    "copy-only": dict(tree_nodes=0, copy_nodes=64, copy_depth=64, copy_branches=4, cost_curve=FLAT),
    "copy-fixed": dict(copy_nodes=40, copy_depth=40, copy_branches=3, adaptive=False, recycle_k=0),
    "copy-capped": dict(copy_nodes=56, copy_capacity=16, max_draft_tokens=9, cost_curve=FLAT),
}
_TUNING_FIELDS = {f.name for f in dataclasses.fields(Tuning)}


def _decoder(**settings) -> LookaheadDecoder:
    """A decoder from settings of either kind: ``Tuning`` fields go to ``_tuning=``, the rest as given."""
    tuning = {k: settings.pop(k) for k in list(settings) if k in _TUNING_FIELDS}
    return LookaheadDecoder(_tuning=Tuning(**tuning) if tuning else None, **settings)


def _policy(config: LookaheadConfig | None = None, **tuning) -> DraftPolicy:
    """A policy over a fresh 12-gram trie, with ``tuning``'s fields changed from the defaults."""
    return DraftPolicy(config or LookaheadConfig(), NgramTrie(12, 4096), tuning=Tuning(**tuning))


def _random_tree(rng, n: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """A parent-first tree without two siblings of the same token (what every source proposes)."""
    parents = np.array([-1] + [int(rng.integers(-1, i)) for i in range(1, n)])
    order = np.argsort(tree_depth_rank(parents)[0], kind="stable")
    index = np.empty(n, np.int64)
    index[order] = np.arange(n)
    bfs = np.where(parents[order] >= 0, index[np.maximum(parents[order], 0)], -1)
    tokens, bfs, _, _ = merge_trees((rng.integers(0, vocab, n)[order], bfs))
    return tokens, bfs


def test_merge_trees_docstring_example():
    tokens, parents, origin, agreement = merge_trees((np.array([5, 6]), np.array([-1, 0])),
                                                     (np.array([5, 7, 8]), np.array([-1, 0, -1])))
    assert tokens.tolist() == [5, 6, 7, 8]
    assert parents.tolist() == [-1, 0, 0, -1]
    assert origin.tolist() == [0, 0, 1, 1]
    assert agreement.tolist() == [1, 0, 0, 0]


def test_merge_equals_merge_trees_keeps_the_first_sources_match_and_counts_the_agreement():
    rng = np.random.default_rng(0)
    for _ in range(500):
        trees = [_random_tree(rng, int(rng.integers(1, 14)), 3) for _ in range(int(rng.integers(1, 4)))]
        want_tokens, want_parents, want_origin, want_agreement = merge_trees(*trees)
        props = [(o, Proposal(t, p, 100 * o + np.arange(len(t)))) for o, (t, p) in enumerate(trees)]
        draft = merge_proposals(props)
        assert draft.tokens.tolist() == want_tokens.tolist()
        assert draft.parents.tolist() == want_parents.tolist()
        assert draft.origin.tolist() == want_origin.tolist()
        assert draft.depth.tolist() == tree_depth_rank(draft.parents)[0].tolist()
        assert draft.agreement.tolist() == want_agreement.tolist()
        # each node's match is the one its first source gave it: find that node by its path
        for i in range(len(draft)):
            path, v = [], i
            while v >= 0:
                path.append(int(draft.tokens[v]))
                v = int(draft.parents[v])
            o = int(draft.origin[i])
            tokens, parents = trees[o]
            for j in range(len(tokens)):
                p, w = [], j
                while w >= 0:
                    p.append(int(tokens[w]))
                    w = int(parents[w])
                if p == path:
                    assert draft.match[i] == 100 * o + j
                    assert draft.rank[i] == tree_depth_rank(parents)[1][j]  # its rank in its own tree
                    break
            else:
                raise AssertionError("merged node not found in its source")


def test_merge_docstring_example_and_an_int_match():
    draft = merge_proposals([(TRIE, Proposal(np.array([5, 6]), np.array([-1, 0]), 2)),
                             (COPY, Proposal(np.array([5, 7, 8]), np.array([-1, 0, -1]), np.array([3, 3, 1])))])
    assert draft.tokens.tolist() == [5, 6, 7, 8] and draft.parents.tolist() == [-1, 0, 0, -1]
    assert draft.origin.tolist() == [TRIE, TRIE, COPY, COPY] and draft.match.tolist() == [2, 2, 3, 1]
    assert draft.agreement.tolist() == [1, 0, 0, 0]  # both drafted 5


def test_copy_source_drafts_the_longest_match_deep_and_buckets_its_length():
    src = CopySource(capacity=1024, max_nodes=40, max_depth=30, branches=2)
    text = list(range(100, 140))
    src.start(np.array(text + [1] + text[:20]))
    p = src.propose(np.zeros(0, np.int64), src.max_nodes, src.max_depth)
    chain = p.tokens[p.parents == np.arange(-1, len(p.tokens) - 1)]
    assert p.tokens[:1].tolist() == [120] and len(p.tokens) <= 40
    assert p.tokens[p.match == 3].tolist()[:3] == [120, 121, 122]  # 20 tokens matched: bucket 3
    assert len(chain) >= 20 and set(p.match[np.isin(p.tokens, chain)].tolist()) == {3}
    src.learn(np.array([120, 121, 122]))
    assert src.index.match_length == 23
    # a node's match is what it follows once its ancestors are accepted: the suffix plus its depth - 1;
    # bucket 1 below 4 tokens, 2 from 4 to 15
    src.start(np.array([5, 6, 9, 9, 5, 6]))  # "5 6" matched (2 tokens), its continuation 9 9 5 6
    p = src.propose(np.zeros(0, np.int64), 8, 8)
    assert p.tokens.tolist()[:4] == [9, 9, 5, 6] and p.parents.tolist()[:4] == [-1, 0, 1, 2]
    assert p.match.tolist()[:4] == [1, 1, 2, 2]  # follows 2, 3, 4, 5 tokens
    src.start(np.array([5, 6, 7, 8, 1, 5, 6, 7, 8]))
    assert set(src.propose(np.zeros(0, np.int64), 8, 8).match.tolist()) == {2}


def test_new_origins_and_the_sources_merge_trie_first():
    assert (ORIGINS[COPY], ORIGINS[MODEL]) == ("copy", "model")
    policy = DraftPolicy(LookaheadConfig(), NgramTrie(12, 4096))
    # the frequent tokens last (asked only when no other source drafts); the window (window="auto": it runs only
    # where the call's cost curve makes its rows cheap) after them, made when a call first runs it
    assert [type(s).__name__ for s in policy.sources] == ["TrieSource", "CopySource", "ModelSource", "FrequentSource"]
    policy.start([1, 2, 3], Limits(100), CostModel(FLAT))
    assert [type(s).__name__ for s in policy.sources][-1] == "WindowSource" and policy.window_on
    only = _policy(LookaheadConfig(window=0), copy_nodes=0, recycle_k=0, fill_nodes=0)
    assert [type(s).__name__ for s in only.sources] == ["TrieSource"]


@pytest.mark.parametrize("adaptive", [True, False])
def test_step_nodes_caps_the_merged_draft(adaptive):
    prompt = list(range(50, 90)) + [7] + list(range(50, 70))
    config = LookaheadConfig(max_draft_tokens=10, cost_curve=FLAT, window=0)
    policy = _policy(config, copy_nodes=40, copy_depth=40, adaptive=adaptive)
    policy.start(prompt, Limits(1000), CostModel(FLAT) if adaptive else None)
    draft = policy.draft(len(prompt), len(prompt), len(prompt) - 1)
    assert len(draft) == 10
    assert np.all(draft.parents < np.arange(10))  # still a tree, parent-first
    full = _policy(copy_nodes=40, copy_depth=40, adaptive=False)
    full.start(prompt, Limits(1000))
    assert len(full.draft(len(prompt), len(prompt), len(prompt) - 1)) > 10
    assert policy.max_rows() == 11


def test_auto_step_nodes_widen_only_where_the_curve_is_flat_that_far():
    """``max_draft_tokens="auto"``: the widest of 255 and 127 nodes for which a step of all the rows they and the window
    add costs at most 1.25 one-token steps, else 63; at 255 the sources draft their wide trees
    (``DraftSource.limits``); never past a static cache's largest bucket, without a budget, or when set."""
    prompt = list(range(50, 150)) + [7] + list(range(50, 130))  # a long copy: the copy source alone drafts 100
    steep = CostModel([(1, 0.010), (2, 0.011), (64, 0.012), (128, 0.020)])  # a GPU at its limit: 152 rows 1.9x
    flat_to_200 = CostModel([(1, 0.010), (200, 0.012), (400, 0.040)])  # 127 nodes and the window fit, 255 do not
    for config, cost, max_rows, expected in (
            (LookaheadConfig(), CostModel(FLAT), None, 255),
            (LookaheadConfig(), flat_to_200, None, 127),
            (LookaheadConfig(), steep, None, 63),
            (LookaheadConfig(), CostModel(FLAT), 64, 63),  # a static cache's buckets
            (LookaheadConfig(), CostModel(FLAT), 200, 127),
            (LookaheadConfig(), None, None, 63),
            (LookaheadConfig(max_draft_tokens=63), CostModel(FLAT), None, 63)):
        policy = _policy(config, copy_nodes=100, copy_depth=100)
        assert policy.step_nodes == 63 and policy.max_rows() == 64  # before a call: what the calibration measures
        policy.start(prompt, Limits(1000, max_rows=max_rows), cost)
        assert policy.step_nodes == expected, (cost, max_rows)
        copy = next(s for s in policy.sources if isinstance(s, CopySource))
        assert copy.limits() == ((200, 100) if expected == 255 else (100, 100))  # twice the nodes at the widest
        assert all(s.wide == (expected == 255) for s in policy.sources)
        draft = policy.draft(len(prompt), len(prompt), len(prompt) - 1)
        assert len(draft) <= expected
        if cost is not None and cost(256) == CostModel(FLAT)(256):  # every node pays: the copy alone drafts 70
            assert (len(draft) > 63) == (expected > 63)
        assert policy.max_rows() == 1 + expected + (24 if policy.window_on else 0)
    assert LookaheadConfig().step_nodes(DEFAULT) == (63, 255)
    assert LookaheadConfig(max_draft_tokens=9).step_nodes(DEFAULT) == (9, 9)


def test_a_source_drafts_its_wide_tree_only_in_the_widest_steps():
    """``DraftSource.limits``: the trie and the copy index twice the nodes, the model's predictions twice the nodes
    and half again the depth; a source that does not widen (the window) keeps its own."""
    config = LookaheadConfig(window=8)
    policy = DraftPolicy(config, NgramTrie(12, 4096))
    policy.start([1, 2, 3], Limits(100))  # (the window's source is made when a call first runs it)
    got = {type(s).__name__: s.limits() for s in policy.sources}
    for s in policy.sources:
        s.wide = True
    wide = {type(s).__name__: s.limits() for s in policy.sources}
    assert got["TrieSource"] == (16, 10) and wide["TrieSource"] == (32, 10)
    assert got["CopySource"] == (56, 32) and wide["CopySource"] == (112, 32)
    assert got["ModelSource"] == (63, 16) and wide["ModelSource"] == (126, 24)
    assert wide["WindowSource"] == got["WindowSource"] and wide["FrequentSource"] == got["FrequentSource"]


def test_a_source_starts_each_call_with_its_trees_as_configured():
    """The policy sets :attr:`DraftSource.wide` per call; a source's ``start`` (where trained heads price their
    tree) never sees the width of the call before."""
    seen = []

    class Recording(FrequentSource):
        def start(self, prompt, model=None):
            seen.append(self.wide)
            super().start(prompt, model)

    class Heads:  # what DraftPolicy asks of trained heads: a source for a step's most nodes and the tuning
        def make_source(self, max_nodes, tuning):
            return Recording(4)

    policy = DraftPolicy(LookaheadConfig(), NgramTrie(12, 4096), heads=Heads())
    source = next(s for s in policy.sources if isinstance(s, Recording))
    policy.start([3, 5, 7], Limits(400), CostModel(FLAT))
    assert policy.step_nodes == 255 and source.wide  # the flat curve: the widest steps
    policy.start([3, 5, 7], Limits(400), CostModel(((1, 1.0), (2, 1.5), (64, 4.0))))
    assert policy.step_nodes == 63 and not source.wide
    assert seen == [False, False]


@pytest.mark.parametrize(
    "field, value",
    [("copy_nodes", -1), ("copy_depth", -3), ("copy_branches", -1), ("copy_capacity", -8), ("copy_nodes", 1.5),
     ("copy_branches", True), ("copy_buckets", [4, 16])],
)
def test_bad_copy_settings_name_field_and_value(field, value):
    with pytest.raises(ValueError) as err:
        Tuning(**{field: value})
    assert f"Tuning.{field}={value!r} is invalid" in str(err.value)


@pytest.mark.parametrize("value", [-1, 2000, True, "wide", 1.5])
def test_bad_max_draft_tokens_name_field_and_value(value):
    with pytest.raises(ValueError) as err:
        LookaheadConfig(max_draft_tokens=value)
    assert f"LookaheadConfig.max_draft_tokens={value!r} is invalid" in str(err.value)


@pytest.mark.parametrize("arch", TINY_ARCHS)
@pytest.mark.parametrize("name", list(COPY_HEAVY))
def test_greedy_is_exact_with_copy_drafts(tiny_models, arch, name):
    model = tiny_models(arch)
    for prompt in (REPETITIVE, NO_REPEAT):
        ids = torch.tensor([prompt])
        plain = model.generate(ids, do_sample=False, max_new_tokens=40, eos_token_id=None)
        dec = _decoder(**COPY_HEAVY[name])
        ours = model.generate(ids, custom_generate=dec, max_new_tokens=40, eos_token_id=None)
        assert ours.tolist() == plain.tolist(), (name, prompt)
        if prompt is REPETITIVE and name != "copy-capped":
            assert dec.stats.drafted_by_origin["copy"] > 0 and dec.stats.accepted_by_origin["copy"] > 0


def test_greedy_is_exact_with_copy_drafts_processors_and_eos(tiny_models):
    model = tiny_models("llama")
    ids = torch.tensor([REPETITIVE])
    kw = dict(max_new_tokens=40, repetition_penalty=1.3, no_repeat_ngram_size=3)
    free = model.generate(ids, do_sample=False, max_new_tokens=40, eos_token_id=None)[0, len(REPETITIVE):]
    for eos in (None, int(free[25])):
        plain = model.generate(ids, do_sample=False, eos_token_id=eos, **kw)
        ours = model.generate(ids, custom_generate=_decoder(**COPY_HEAVY["copy-only"]), eos_token_id=eos, **kw)
        assert ours.tolist() == plain.tolist()


@pytest.mark.parametrize("name", list(COPY_HEAVY))
def test_sampled_text_does_not_depend_on_copy_drafts(tiny_models, name):
    """The uniforms belong to positions: a seed gives the same text with copy drafts as with none."""
    model = tiny_models("qwen2")
    ids = torch.tensor([REPETITIVE])
    outs = []
    for dec in (_decoder(tree_nodes=0, copy_nodes=0), _decoder(**COPY_HEAVY[name])):
        torch.manual_seed(5)
        outs.append(model.generate(ids, custom_generate=dec, do_sample=True, temperature=0.8, top_k=20,
                                   max_new_tokens=30, eos_token_id=None).tolist())
    assert outs[0] == outs[1]


# -- the model's own predictions (Token Recycling) -------------------------------------------------------


def _keys(table: SuccessorTable) -> int:
    """Keys (tokens and pairs) with a row."""
    return int(np.count_nonzero(table.keys))


def test_successor_table_docstring_example():
    table = SuccessorTable(2, rows=64, calibration=0.5)
    table.update(np.array([-1, -1]), np.array([5, 6]), np.array([[6, 7], [8, 9]]),
                 np.array([[2.0, -0.2], [5.0, -5.0]], np.float32))  # shares 0.9/0.1 and 1.0/0.0
    tokens, parents, shares = table.propose(-1, 5, 3, 8)
    assert tokens.tolist() == [6, 8, 7] and parents.tolist() == [-1, 0, -1]
    assert shares.tolist() == pytest.approx([0.9, 1.0, 0.1])
    assert table.propose(-1, 5, 8, 1)[0].tolist() == [6, 7]  # one level deep
    assert table.propose(-1, 4, 8, 8)[0].tolist() == []  # nothing known after 4


def test_successor_table_buckets_its_shares_as_searchsorted_does():
    """``propose`` with edges: the tree it gives without, each share replaced by 1 + the bucket edges it reaches
    (a ``ModelSource``'s ``buckets``, ``Tuning.recycle_buckets``), a share at an edge (0.95 exactly) in the upper
    bucket."""
    table = SuccessorTable(3, rows=64)
    logits = np.array([[np.log(19.0), 0.0, -30.0], [0.0, 0.0, 0.0], [5.0, -40.0, -40.0]], np.float32)
    table.update(np.array([-1, -1, -1]), np.array([5, 6, 7]), np.array([[6, 7, 8], [9, 10, 11], [12, 13, 14]]),
                 logits)  # 5 -> 6 (share 0.95), 7, 8; 6 -> thirds; 7 -> 12 (share 1.0)
    edges = ModelSource(3, 12, 3, buckets=DEFAULT.recycle_buckets).buckets
    assert edges.tolist() == [0.95, 2.0]
    for last in (5, 6, 7, 4):
        tokens, parents, shares = table.propose(-1, last, 12, 3)
        b_tokens, b_parents, buckets = table.propose(-1, last, 12, 3, edges)
        assert b_tokens.tolist() == tokens.tolist() and b_parents.tolist() == parents.tolist()
        assert buckets.tolist() == (1 + edges.searchsorted(shares, side="right")).tolist()
    assert table.propose(-1, 5, 1, 1, edges)[2].tolist() == [2]  # 0.95 reaches the first edge


def test_successor_table_pairs_first_later_rows_replace_unknown_rows_skipped():
    table = SuccessorTable(2, rows=64)
    table.update(np.array([-1]), np.array([5]), np.array([[6, 7]]), np.zeros((1, 2), np.float32))
    table.update(np.array([3]), np.array([5]), np.array([[9, 8]]), np.array([[4.0, 0.0]], np.float32))
    assert table.propose(3, 5, 1, 1)[0].tolist() == [9]  # the pair (3, 5) has its own row
    assert table.propose(2, 5, 1, 1)[0].tolist() == [9]  # the token's row: the later one replaced [6, 7]
    table.update(np.array([-1, -1]), np.array([5, 11]), np.array([[-1, -1], [1, 2]]), np.zeros((2, 2), np.float32))
    assert table.propose(-1, 5, 1, 1)[0].tolist() == [9] and _keys(table) == 3  # the -1 row was skipped
    # tokens sharing a slot (rows=64: 5 and 69) take turns
    table.update(np.array([-1]), np.array([69]), np.array([[1, 2]]), np.zeros((1, 2), np.float32))
    assert table.propose(-1, 5, 1, 1)[0].tolist() == [] and table.propose(-1, 69, 1, 1)[0].tolist() == [1]
    twin = pickle.loads(pickle.dumps(table))
    assert twin.propose(3, 5, 4, 4)[0].tolist() == table.propose(3, 5, 4, 4)[0].tolist()
    assert len(pickle.dumps(SuccessorTable(8))) < 2_000


def test_successor_table_slots_lie_side_by_side_token_zero_and_older_pickles():
    """A slot's key, ids and shares are views of one zeroed buffer, a slot's bytes side by side; an empty slot's key
    is 0, so token 0 (key 1) has a row like any other; a pickle from when a token's key was its id still loads."""
    table = SuccessorTable(2, rows=64)
    assert table.keys.base is table.ids.base is table.share.base and table.keys.strides == (8 + 8 * 2,)
    assert _keys(table) == 0 and not table.keys.any()
    table.update(np.array([-1, 0]), np.array([0, 5]), np.array([[7, 8], [9, 10]]),
                 np.array([[1.0, 0.0], [2.0, 0.0]], np.float32))
    assert table.propose(-1, 0, 1, 1)[0].tolist() == [7] and _keys(table) == 3  # token 0's row, 5's, the pair (0, 5)
    state = table.__getstate__()
    old = dict(state, keys=np.where(state["used"] < 64, state["keys"] - 1, state["keys"]))  # a token's key: its id
    del old["token_keys"]
    for copy in (pickle.loads(pickle.dumps(table)), SuccessorTable.__new__(SuccessorTable)):
        if not len(copy.__dict__):
            copy.__setstate__(old)
        assert copy.keys.tolist() == table.keys.tolist()
        assert copy.propose(0, 5, 4, 4)[0].tolist() == table.propose(0, 5, 4, 4)[0].tolist() == [9, 10]
    table.clear()
    assert _keys(table) == 0 and table.propose(-1, 0, 1, 1)[0].tolist() == []


def test_successor_table_clear_empties_what_every_way_of_learning_wrote():
    """``clear`` skips a table nothing was learned into since it was made or cleared; each way of writing rows
    (``update``, ``learn_step``, a loaded pickle) leaves a table that ``clear`` empties."""
    rows = (np.array([-1, 3]), np.array([3, 5]), np.array([[4, 6], [7, 8]]), np.zeros((2, 2), np.float32))
    table = SuccessorTable(2, rows=64)
    table.clear()  # a new table: nothing to do
    assert _keys(table) == 0
    table.update(*rows)
    twin = pickle.loads(pickle.dumps(table))
    stepped = SuccessorTable(2, rows=64)
    stepped.learn_step(-1, 3, np.array([5]), np.array([-1]), np.array([0, 1]), rows[2], rows[3])
    for t in (table, twin, stepped):
        assert _keys(t) == 3 and t.propose(3, 5, 1, 1)[0].tolist() == [7]
        t.clear()
        assert _keys(t) == 0 and t.propose(3, 5, 1, 1)[0].tolist() == [] and t.propose(-1, 3, 1, 1)[0].tolist() == []
        t.update(*rows)  # a cleared table learns again, and clears again
        assert _keys(t) == 3
        t.clear()
        assert _keys(t) == 0


def test_model_source_learns_rows_with_their_contexts_the_accepted_path_last():
    src = ModelSource(k=2, max_nodes=8, max_depth=4)
    src.start(np.array([1, 2, 3]))
    # the draft after 3: 4 (node 0) -> 5 (node 1), and 6 (node 2), a sibling of 4 (merged depth-first); node 0
    # accepted
    draft = merge_proposals([(MODEL, Proposal(np.array([4, 6, 5]), np.array([-1, -1, 0]), 1))])
    assert draft.tokens.tolist() == [4, 5, 6] and draft.parents.tolist() == [-1, 0, -1]
    ids = np.array([[4, 6], [5, 7], [10, 11], [8, 9]])  # rows: the last token 3, then nodes 4, 5, 6
    src.learn_rows(draft, [0], ids, np.zeros((4, 2), np.float32))
    src.learn(np.array([4, 5]))
    table = src.table
    assert table.propose(2, 3, 1, 1)[0].tolist() == [4]  # (2, 3): the root row
    assert table.propose(3, 4, 1, 1)[0].tolist() == [5] and table.propose(3, 6, 1, 1)[0].tolist() == [8]
    assert table.propose(4, 5, 1, 1)[0].tolist() == [10]  # node 5's context is (4, 5)
    assert (src.prev, src.last) == (4, 5)
    p = src.propose(np.zeros(0, np.int64), 8, 4)
    assert p.tokens.tolist() == [10, 11] and set(p.match.tolist()) <= {1, 2}


def test_model_source_keeps_its_table_for_the_same_model_only():
    class M:
        pass

    a, b = M(), M()
    src = ModelSource(k=2, max_nodes=4, max_depth=2, keep=True)
    src.start(np.array([1, 2]), a)
    src.table.update(np.array([-1]), np.array([2]), np.array([[3, 4]]), np.zeros((1, 2), np.float32))
    src.start(np.array([7, 2]), a)
    assert _keys(src.table) == 1
    src.start(np.array([7, 2]), b)
    assert _keys(src.table) == 0
    fresh = ModelSource(k=2, max_nodes=4, max_depth=2, keep=False)
    fresh.table.update(np.array([-1]), np.array([2]), np.array([[3, 4]]), np.zeros((1, 2), np.float32))
    fresh.start(np.array([7, 2]), a)
    assert _keys(fresh.table) == 0


def test_policy_hands_the_rows_to_the_model_source_and_learns_the_prompt_on_a_flat_curve():
    prompt = [3, 5, 7, 9]
    flat = DraftPolicy(LookaheadConfig(cost_curve=FLAT), NgramTrie(12, 4096))
    flat.start(prompt, Limits(100), CostModel(FLAT))
    assert flat.recycle_k == 8 and flat.prompt_rows
    steep = DraftPolicy(LookaheadConfig(), NgramTrie(12, 4096))
    steep.start(prompt, Limits(100), CostModel(((1, 1.0), (2, 1.5), (64, 4.0))))
    assert not steep.prompt_rows
    assert _policy(recycle_k=0).recycle_k == 0
    k = 8
    flat.learn_prompt(np.array(prompt[:-1]), np.tile(np.arange(k), (3, 1)), np.zeros((3, k), np.float32))
    assert _keys(flat.model.table) == 3 + 2  # tokens 3, 5, 7 and pairs (3, 5), (5, 7)
    draft = flat.draft(4, 4, 3)
    ids = np.tile(np.arange(100, 100 + k), (1 + len(draft), 1))
    flat.learn(draft, [], [11], None, 1 + len(draft), 0.01, (ids, np.zeros_like(ids, dtype=np.float32)))
    assert flat.model.table.propose(7, 9, 1, 1)[0].tolist() == [100]  # the last prompt token's row


@pytest.mark.parametrize(
    "field, value",
    [("recycle_k", -1), ("recycle_nodes", -1), ("recycle_depth", -2), ("recycle_keep", 1), ("recycle_k", 2.0),
     ("recycle_calibration", -0.5), ("recycle_buckets", 0.95)],
)
def test_bad_recycle_settings_name_field_and_value(field, value):
    with pytest.raises(ValueError) as err:
        Tuning(**{field: value})
    assert f"Tuning.{field}={value!r} is invalid" in str(err.value)


MODEL_HEAVY = {
    "model-only": dict(tree_nodes=0, copy_nodes=0, cost_curve=FLAT),
    "model-fixed": dict(tree_nodes=0, copy_nodes=0, recycle_nodes=32, recycle_depth=16, adaptive=False),
    "all-flat": dict(cost_curve=FLAT, recycle_k=4),
}


@pytest.mark.parametrize("arch", TINY_ARCHS)
@pytest.mark.parametrize("name", list(MODEL_HEAVY))
def test_greedy_is_exact_with_the_models_predictions(tiny_models, arch, name):
    """One decoder over several calls (the table carries over), each output plain generate's; the second
    pass over the same prompts accepts the model's predictions."""
    model = tiny_models(arch)
    dec = _decoder(**MODEL_HEAVY[name])
    for rnd in range(2):
        accepted = 0
        for prompt in (REPETITIVE, NO_REPEAT):
            ids = torch.tensor([prompt])
            plain = model.generate(ids, do_sample=False, max_new_tokens=30, eos_token_id=None)
            ours = model.generate(ids, custom_generate=dec, max_new_tokens=30, eos_token_id=None)
            assert ours.tolist() == plain.tolist(), (name, rnd, prompt)
            accepted += dec.stats.accepted_by_origin["model"]
        if rnd:
            assert accepted > 0


def test_greedy_is_exact_with_the_models_predictions_padding_processors_eos(tiny_models):
    model = tiny_models("llama")
    ids = torch.tensor([[0, 0] + NO_REPEAT])
    mask = torch.tensor([[0, 0] + [1] * len(NO_REPEAT)])
    free = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30, eos_token_id=None)
    for kw in (dict(repetition_penalty=1.3), dict(eos_token_id=int(free[0, -10]))):
        kw = {"eos_token_id": None, **kw}
        plain = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30, **kw)
        dec = _decoder(**MODEL_HEAVY["model-only"])
        for _ in range(2):
            ours = model.generate(ids, attention_mask=mask, custom_generate=dec, max_new_tokens=30, **kw)
            assert ours.tolist() == plain.tolist()


@pytest.mark.parametrize("name", list(MODEL_HEAVY))
def test_sampled_text_does_not_depend_on_the_models_predictions(tiny_models, name):
    model = tiny_models("mistral")
    ids = torch.tensor([REPETITIVE])
    dec = _decoder(**MODEL_HEAVY[name])
    for _ in range(2):  # the second call drafts from what the first one's rows taught
        outs = []
        for d in (_decoder(tree_nodes=0, copy_nodes=0, recycle_k=0), dec):
            torch.manual_seed(11)
            outs.append(model.generate(ids, custom_generate=d, do_sample=True, temperature=0.8, max_new_tokens=30,
                                       eos_token_id=None).tolist())
        assert outs[0] == outs[1]


def test_the_decoder_takes_topk_only_when_the_source_is_on(tiny_models, monkeypatch):
    import lookahead.verify as kernels_module  # the Verifier's readout kernels

    model = tiny_models("qwen2")
    calls = []  # (rows whose top-k is read, k) of each pass over the logits
    real, real_step = kernels_module.rows_top, kernels_module.greedy_row

    def spy(logits, argmax_rows, top_rows, k, argmax, ids, vals):
        calls.append((int(top_rows.sum()), k))
        return real(logits, argmax_rows, top_rows, k, argmax, ids, vals)

    def spy_step(logits, rows, k, tokens, *rest):  # a greedy CPU step's readout and verdict in one call
        calls.append((len(tokens) + 1, k))
        return real_step(logits, rows, k, tokens, *rest)

    monkeypatch.setattr(kernels_module, "rows_top", spy)
    monkeypatch.setattr(kernels_module, "greedy_row", spy_step)
    ids = torch.tensor([REPETITIVE])
    dec = _decoder(recycle_k=0)
    model.generate(ids, custom_generate=dec, max_new_tokens=10, eos_token_id=None)
    assert not calls  # greedy's argmax only: no top-k kept
    calls.clear()
    dec = LookaheadDecoder(cost_curve=FLAT)
    model.generate(ids, custom_generate=dec, max_new_tokens=10, eos_token_id=None)
    # the prompt's rows once (flat curve), then the verified rows of each step (never the window's)
    assert calls[0] == (len(REPETITIVE) - 1, 8) and len(calls) == 1 + dec.stats.target_calls
    assert all(k == 8 for _, k in calls)


def test_shallowest_cuts_to_the_breadth_of_the_tree_in_its_order():
    draft = build_draft(np.array([5, 6, 7, 8]), np.array([-1, 0, 1, -1]), np.zeros(4, np.int8), np.ones(4, np.int64))
    cut = draft.shallowest(2)
    assert cut.tokens.tolist() == [5, 8] and cut.parents.tolist() == [-1, -1] and cut.depth.tolist() == [1, 1]
    assert draft.shallowest(3).tokens.tolist() == [5, 6, 8] and draft.shallowest(3).parents.tolist() == [-1, 0, -1]
    assert draft.shallowest(4) is draft and len(draft.shallowest(0)) == 0 and len(draft.shallowest(-1)) == 0


def test_merged_drafts_put_the_first_drafted_path_in_the_first_rows():
    # the trie's chain 5 6 7 with a sibling 9 under 5, the copy's 5 6 8 and 4: depth-first, first drafted first
    draft = merge_proposals([(TRIE, Proposal(np.array([5, 6, 9, 7]), np.array([-1, 0, 0, 1]), 2)),
                             (COPY, Proposal(np.array([4, 5, 6, 8]), np.array([-1, -1, 1, 2]), 1))])
    assert draft.tokens.tolist() == [5, 6, 7, 8, 9, 4]
    assert draft.parents.tolist() == [-1, 0, 1, 1, 0, -1]
    assert draft.depth.tolist() == [1, 2, 3, 3, 2, 1]
    assert draft.origin.tolist() == [TRIE, TRIE, TRIE, COPY, TRIE, COPY]


def test_frequent_source_docstring_example_and_its_order():
    src = FrequentSource(2)
    assert src.propose(np.zeros(0, np.int64), 2, 1) is None  # nothing seen yet
    src.start(np.array([5, 7, 5, 9, 7, 5]))
    p = src.propose(np.zeros(0, np.int64), 2, 1)
    assert p.tokens.tolist() == [5, 7] and p.parents.tolist() == [-1, -1] and p.match == 1
    src.learn(np.array([9, 9]))
    assert src.top == [5, 9]  # both 3: 5 reached it first
    src.learn(np.array([9]))
    assert src.top == [9, 5]
    assert src.propose(np.zeros(0, np.int64), 1, 1).tokens.tolist() == [9]
    src.start(np.array([4, 4, 3]))  # a new call counts its own context only
    assert src.top == [4, 3] and src.counts == {4: 2, 3: 1}


STEPS = CostModel([(1, 0.010), (2, 0.008), (4, 0.012), (64, 0.05)], steps=True)  # 2 rows cost less than one


def test_the_frequent_tokens_draft_only_a_priced_step_no_other_source_drafts_for():
    prompt = [5, 7, 5, 9, 7, 5, 8]  # 8 is new: the trie, the copy index and the model's table have nothing after it
    policy = DraftPolicy(LookaheadConfig(), NgramTrie(12, 4096))
    policy.start(prompt, Limits(100), STEPS)
    draft = policy.draft(len(prompt), len(prompt), len(prompt) - 1)
    assert draft.tokens.tolist() == [5] and draft.origin.tolist() == [FREQUENT]  # 2 rows: the cheapest step
    policy.learn(draft, [], [5], rows=2)
    draft = policy.draft(len(prompt) + 1, len(prompt) + 1, len(prompt))  # after 5: the trie drafts 7 or 9
    assert len(draft) and FREQUENT not in draft.origin.tolist()
    for tuning, cost in ((dict(fill_nodes=0), STEPS), (dict(adaptive=False), None),
                         ({}, CostModel(((1, 0.010), (2, 0.015), (64, 0.05))))):
        policy = _policy(**tuning)
        policy.start(prompt, Limits(100), cost)
        assert not len(policy.draft(len(prompt), len(prompt), len(prompt) - 1)), tuning  # off, no budget, too dear


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_greedy_and_sampled_are_exact_with_the_frequent_tokens(tiny_models, arch):
    from lookahead.cost import Calibrations

    model = tiny_models(arch)
    registry = Calibrations()
    registry.pin(model, STEPS)
    only = dict(tree_nodes=0, copy_nodes=0, recycle_k=0)  # every step drafts the frequent tokens alone
    for prompt in (REPETITIVE, NO_REPEAT):
        ids = torch.tensor([prompt])
        plain = model.generate(ids, do_sample=False, max_new_tokens=30, eos_token_id=None)
        dec = _decoder(_calibrations=registry, **only)
        assert model.generate(ids, custom_generate=dec, max_new_tokens=30, eos_token_id=None).tolist() == plain.tolist()
        assert dec.stats.drafted_by_origin["frequent"] >= dec.stats.target_calls - 1
        outs = []
        for d in (_decoder(_calibrations=registry, fill_nodes=0, **only), _decoder(_calibrations=registry, **only)):
            torch.manual_seed(5)
            outs.append(model.generate(ids, custom_generate=d, do_sample=True, temperature=0.9, max_new_tokens=30,
                                       eos_token_id=None).tolist())
        assert outs[0] == outs[1]


def _old_keep(draft: Draft, nodes) -> Draft:
    """``Draft.keep`` as a fancy index per array, parents re-indexed in Python (the reference for the kernel)."""
    nodes = np.asarray(nodes, dtype=np.int64)
    index = {int(i): j for j, i in enumerate(nodes)}
    parents = np.array([index[int(p)] if p >= 0 else -1 for p in draft.parents[nodes]], dtype=np.int64)
    return Draft(draft.tokens[nodes], parents, draft.origin[nodes], draft.match[nodes],
                 draft.depth[nodes], draft.rank[nodes], draft.agreement[nodes], draft.window)


def _same(a: Draft, b: Draft) -> None:
    for name in ("tokens", "parents", "origin", "match", "depth", "rank", "agreement"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.tolist() == y.tolist(), name


def test_keep_shallowest_and_the_merges_cut_equal_their_numpy_references():
    from lookahead.drafting import kernels as K

    rng = np.random.default_rng(3)
    for _ in range(300):
        trees = [_random_tree(rng, int(rng.integers(1, 20)), 4) for _ in range(int(rng.integers(1, 4)))]
        props = [(o, Proposal(t, p, int(rng.integers(1, 4)))) for o, (t, p) in zip((TRIE, COPY, MODEL), trees)]
        draft = merge_proposals(props)
        n = len(draft)
        count = int(rng.integers(-1, n + 2))
        want = np.sort(np.argsort(draft.depth, kind="stable")[: max(count, 0)])
        assert K.shallowest_nodes(draft.depth, count).tolist() == want.tolist()
        if 0 < count < n:
            _same(draft.shallowest(count), _old_keep(draft, want))
            _same(merge_proposals(props, limit=count), _old_keep(draft, want))  # the cut inside the merge
        else:
            _same(merge_proposals(props, limit=max(count, 0)), draft.shallowest(count))
        chosen = np.flatnonzero(rng.random(n) < 0.5)
        closed = np.unique(np.concatenate([chosen] + [[j for j in _ancestors(draft.parents, i)] for i in chosen]
                                          )).astype(np.int64) if len(chosen) else chosen
        if 0 < len(closed) < n:
            _same(draft.keep(closed), _old_keep(draft, closed))
    with pytest.raises(ValueError, match="parent"):
        merge_proposals([(TRIE, Proposal(np.array([5, 6]), np.array([-1, 0]), 2))]).keep([1])


def _ancestors(parents, i):
    while parents[i] >= 0:
        i = int(parents[i])
        yield i


def test_no_source_is_asked_for_more_nodes_than_a_step_verifies():
    """The call's step nodes (``max_draft_tokens``) cap what each source drafts (a trained head's 127-node tree
    drafts 63 on a CPU call)."""
    prompt = list(range(50, 90)) + [7] + list(range(50, 70))
    policy = _policy(LookaheadConfig(max_draft_tokens=10, window=0), copy_nodes=40, copy_depth=40, adaptive=False)
    asked = []
    for source in policy.sources:
        def spy(context, max_nodes, max_depth, propose=source.propose):
            asked.append(max_nodes)
            return propose(context, max_nodes, max_depth)
        source.propose = spy
    policy.start(prompt, Limits(1000))
    policy.draft(len(prompt), len(prompt), len(prompt) - 1)
    assert asked and max(asked) == 10 and 40 in [s.max_nodes for s in policy.sources]
