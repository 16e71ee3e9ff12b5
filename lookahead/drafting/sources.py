"""The draft sources: the protocol every source follows (:class:`DraftSource`), the copying and prediction
sources, and :func:`merge_proposals`, which unites their trees into one :class:`~lookahead.drafting.draft.Draft`."""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass

import numpy as np

from .._tuning import DEFAULT
from ..cache import NgramTrie, SuffixIndex
from .draft import COPY, CORPUS, FREQUENT, MODEL, Draft, WindowRows
from .kernels import merge_trees
from .recycle import SuccessorTable


@dataclass(frozen=True)
class Proposal:
    """One source's tree: ``tokens``, ``parents`` int64[n] (parent-first) and ``match``: the match bucket of every
    node (an int) or of each (int64[n]). Example: ``Proposal(array([5, 6]), array([-1, 0]), 2)``."""

    tokens: np.ndarray
    parents: np.ndarray
    match: int | np.ndarray


class DraftSource:
    """Base of every source: a subclass sets ``origin`` (an index into ``draft.ORIGINS``), ``max_nodes``,
    ``max_depth`` and ``propose(context, max_nodes, max_depth) -> Proposal | None`` (a tree after ``context``,
    int64[c]: the context's last ``max_match`` tokens). What else it needs it declares by a flag, and the
    policy hands it over: ``priced``: ``priced_depth(depth, cost, margin)``, how deep to draft (at most
    ``depth``; 0: skip) on the cost curve ``cost`` (None: no budget); ``wants_rows``: ``learn_rows(draft,
    accepted_nodes, top_ids, top_logits)``, the last token's row and each node's top-k ids int64[1 + n, k] and
    logits; ``wants_hidden``: ``observe_hidden(hidden)``, final hidden states float[a, H] of the root's row
    and each accepted node's (both before :meth:`learn`); ``learns_lazily``: its state depends on the tokens
    alone, so it learns them just before it next proposes; ``fallback``: asked only on a priced step no other
    source drafts for."""

    origin: int
    max_nodes: int
    max_depth: int
    wide: bool = False
    """This call's steps are the widest ``"auto"`` takes: :meth:`limits` scales by ``wide_nodes``, ``wide_depth``."""
    wide_nodes: int = 1
    wide_depth: float = 0.0
    priced = wants_rows = wants_hidden = learns_lazily = fallback = False
    transient: tuple[str, ...] = ()
    """Attributes bound to one model (tensors, modules, a shared store): a copy or a pickle leaves them behind."""

    def __getstate__(self) -> dict:
        return {**self.__dict__, **dict.fromkeys(self.transient)}

    def start(self, prompt: np.ndarray, model=None) -> None:
        """A call begins: ``prompt`` int64[L], the target ``model`` (None in a replay)."""

    def limits(self) -> tuple[int, int]:
        """(the most nodes, the deepest path) this source drafts per step in this call."""
        if not self.wide:
            return self.max_nodes, self.max_depth
        return self.wide_nodes * self.max_nodes, self.max_depth + int(self.wide_depth * self.max_depth)

    def learn(self, emitted: np.ndarray) -> None:
        """The step emitted ``emitted`` int64[k]."""


class TrieSource(DraftSource):
    """Drafts from an n-gram trie, matching up to ``max_match`` context tokens. ``per_request``: the request's trie
    (``start`` clears it and inserts the prompt); else a shared store (``start`` begins a new stream; no prompt)."""

    learns_lazily = True
    wide_nodes = 2

    def __init__(self, trie: NgramTrie, origin: int, max_match: int, per_request: bool, max_nodes: int = 16,
                 max_depth: int = 10):
        self.trie, self.origin, self.per_request = trie, origin, per_request
        self.max_match = min(max_match, trie.max_n - 1)
        self.max_nodes, self.max_depth = max_nodes, max_depth

    def start(self, prompt: np.ndarray, model=None) -> None:
        if self.per_request:
            self.trie.clear()
            self.trie.insert(prompt)
        else:
            self.trie.reset_stream()

    def propose(self, context: np.ndarray, max_nodes: int, max_depth: int) -> Proposal | None:
        if max_nodes <= 0:
            return None
        tokens, parents, match = self.trie.propose(context, max_nodes, max_depth, self.max_match, with_match=True)
        return Proposal(tokens, parents, match) if len(tokens) else None

    def learn(self, emitted: np.ndarray) -> None:
        self.trie.insert(emitted)


class ReadOnlyStore:
    """A shared store as a batch row sees it: it proposes, and the batch writes each row's output as a stream of its
    own when the call ends (rows interleaved in one stream would join their n-grams)."""

    def __init__(self, store: NgramTrie):
        self.store, self.max_n, self.propose = store, store.max_n, store.propose

    def insert(self, *_) -> None:
        """Writes nothing, nor begins a stream (``reset_stream``)."""

    reset_stream = insert


class CorpusSource(TrieSource):
    """Drafts from a corpus's read-only store (``corpus.DraftCorpus.shared_store``), shared by every decoder,
    thread and batch row; it learns nothing."""

    learns_lazily = False
    transient = ("trie",)
    start = DraftSource.start
    learn = DraftSource.learn

    def __init__(self, store: NgramTrie, max_match: int, max_nodes: int = 16, max_depth: int = 10):
        super().__init__(store, CORPUS, max_match, per_request=False, max_nodes=max_nodes, max_depth=max_depth)

    def __deepcopy__(self, memo) -> CorpusSource:
        other = copy.copy(self)  # shares the read-only store (a copy would cost its size)
        other.trie = self.trie
        memo[id(self)] = other
        return other


def _edges(values) -> np.ndarray:
    edges = np.array(values)
    edges.flags.writeable = False
    return edges


class CopySource(DraftSource):
    """Longest-match copies of the request's context (``lookahead.cache.SuffixIndex``): the continuation of its
    longest earlier match, ``max_depth`` deep, beside up to ``branches - 1`` continuations of that match or a shorter
    one (chains of ``branch_depth``). A node's match is the context it follows once its ancestors are accepted,
    bucketed by ``buckets`` (1 below the first edge, 2 below the second, else 3). Example: 2 tokens matched, a chain
    5 deep, buckets (4, 16): matches 2..6 -> buckets 1, 1, 2, 2, 2."""

    origin = COPY
    wide_nodes = 2
    learns_lazily = True

    def __init__(self, capacity: int, max_nodes: int, max_depth: int, branches: int, branch_depth: int = 8,
                 buckets=DEFAULT.copy_buckets):
        self.index = SuffixIndex(capacity)
        self.max_nodes, self.max_depth, self.branches, self.branch_depth = max_nodes, max_depth, branches, branch_depth
        self.buckets = _edges(buckets)

    def start(self, prompt: np.ndarray, model=None) -> None:
        self.index.clear()
        self.index.extend(prompt)

    def propose(self, context: np.ndarray, max_nodes: int, max_depth: int) -> Proposal | None:
        tokens, parents, match = self.index.propose_buckets(max_nodes, max_depth, self.branches, self.branch_depth,
                                                            self.buckets)
        return Proposal(tokens, parents, match) if len(tokens) else None

    def learn(self, emitted: np.ndarray) -> None:
        self.index.extend(emitted)


class ModelSource(DraftSource):
    """The model's own predictions: a best-first tree from the last two tokens through a
    :class:`~lookahead.drafting.recycle.SuccessorTable`; a node's match is its share, bucketed by ``buckets``.
    ``keep``: the table lives across calls on one model; ``table``: one shared by a batch's rows."""

    origin = MODEL
    wide_nodes, wide_depth = 2, 0.5
    wants_rows = True
    transient = ("_model",)

    def __init__(self, k: int, max_nodes: int, max_depth: int, keep: bool = False, table: SuccessorTable | None = None,
                 calibration: float = DEFAULT.recycle_calibration, buckets=DEFAULT.recycle_buckets):
        self.k, self.max_nodes, self.max_depth, self.keep = k, max_nodes, max_depth, keep
        self.table = SuccessorTable(k, calibration=calibration) if table is None else table
        self.buckets = _edges(buckets)
        self.prev = self.last = -1
        self._model = None  # a weak reference to the model the table was learned from

    def start(self, prompt: np.ndarray, model=None) -> None:
        same = model is not None and self._model is not None and self._model() is model
        if not (self.keep and (same or model is None)):
            self.table.clear()
        if model is not None:
            self._model = weakref.ref(model)
        self.prev, self.last = (int(t) for t in np.concatenate([[-1, -1], prompt[-2:]])[-2:])

    def propose(self, context: np.ndarray, max_nodes: int, max_depth: int) -> Proposal | None:
        if self.last < 0:
            return None
        tokens, parents, match = self.table.propose(self.prev, self.last, max_nodes, max_depth, self.buckets)
        return Proposal(tokens, parents, match) if len(tokens) else None

    def learn(self, emitted: np.ndarray) -> None:
        for t in emitted[-2:].tolist():
            self.prev, self.last = self.last, t

    def learn_rows(self, draft: Draft, accepted_nodes, top_ids: np.ndarray, top_logits: np.ndarray) -> None:
        path = np.array([0, *(1 + j for j in accepted_nodes)], dtype=np.int64)  # learned last: they win a key
        self.table.learn_step(self.prev, self.last, draft.tokens, draft.parents, path, top_ids, top_logits)


class FrequentSource(DraftSource):
    """The context's ``max_nodes`` most frequent tokens, each a child of the root, drafted only on a step no other
    source drafts for (``fallback``: where a 2-row step costs less than a 1-row one). Ties: the first to the count.
    Example: prompt ``[5, 7, 5, 9, 7, 5]``, 2 nodes -> ``[5, 7]``; after ``[9, 9]``: ``[5, 9]``."""

    origin = FREQUENT
    fallback = True
    learns_lazily = True

    def __init__(self, max_nodes: int):
        self.max_nodes, self.max_depth = max_nodes, 1
        self.counts: dict[int, int] = {}
        self.top: list[int] = []  # most frequent first

    def start(self, prompt: np.ndarray, model=None) -> None:
        ids, first, counts = np.unique(prompt, return_index=True, return_counts=True)
        self.counts = dict(zip(ids.tolist(), counts.tolist()))
        self.top = ids[np.lexsort((first, -counts))[: self.max_nodes]].tolist()

    def propose(self, context: np.ndarray, max_nodes: int, max_depth: int) -> Proposal | None:
        n = min(max_nodes, len(self.top))
        if not n:
            return None
        return Proposal(np.array(self.top[:n], dtype=np.int64), np.full(n, -1, dtype=np.int64), 1)

    def learn(self, emitted: np.ndarray) -> None:
        counts, top = self.counts, self.top
        for t in emitted.tolist():
            c = counts[t] = counts.get(t, 0) + 1
            if t in top:
                i = top.index(t)
            elif len(top) < self.max_nodes:
                top.append(t)
                i = len(top) - 1
            elif c > counts[top[-1]]:
                top[-1] = t
                i = len(top) - 1
            else:
                continue
            while i and counts[top[i - 1]] < c:  # an equal count reached first stays ahead
                top[i - 1], top[i] = top[i], top[i - 1]
                i -= 1


def merge_proposals(proposals: list[tuple[int, Proposal]], window: WindowRows | None = None,
                    limit: int | None = None) -> Draft:
    """One draft from ``(origin, proposal)`` pairs: a path several sources drafted appears once, with the first
    one's origin, match and rank, and its agreement (how many others drafted it); depth-first, siblings in the
    order first drafted; at most ``limit`` nodes (the shallowest). Example: tokens ``[5, 6]`` parents ``[-1, 0]``,
    then tokens ``[5, 7, 8]`` parents ``[-1, 0, -1]`` -> tokens ``[5, 6, 7, 8]``, parents ``[-1, 0, 0, -1]``,
    agreement ``[1, 0, 0, 0]``; with limit 3: tokens ``[5, 6, 8]``."""
    if not proposals:
        return Draft.empty(window)
    total = sum(len(p.tokens) for _, p in proposals)
    tokens, parents, match = np.empty(total, np.int64), np.empty(total, np.int64), np.empty(total, np.int64)
    origin, starts = np.empty(total, np.int8), np.empty(len(proposals) + 1, np.int64)
    a = 0
    for t, (o, p) in enumerate(proposals):
        b = a + len(p.tokens)
        starts[t] = a
        tokens[a:b], parents[a:b], match[a:b], origin[a:b] = p.tokens, p.parents, p.match, o
        a = b
    starts[-1] = a
    ints, origin = merge_trees(tokens, parents, origin, match, starts, total if limit is None else limit)
    return Draft(ints[0], ints[1], origin, ints[2], ints[3], ints[4], ints[5], window)

