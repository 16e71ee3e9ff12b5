"""The copying and model-prediction draft sources, and how their trees merge into one draft.

Every source follows the protocol of ``source.py`` (:class:`~lookahead.source.DraftSource`). Each node of a merged draft knows which source drafted it (its *origin*, see ``draft.ORIGINS``):

- :class:`TrieSource` over the request's own trie (``"trie"``): the prompt and the output so far;
  cleared at every call.
- :class:`TrieSource` over a shared store (``"memory"``, ``LookaheadDecoder(trie=NgramTrie(...))``):
  it learns only *output* tokens, so the n-grams of earlier answers persist while a finished
  request's prompt n-grams fade with it; its node capacity bounds its memory (LRU eviction).
- :class:`CorpusSource` (``"corpus"``): a store of the model's own writing (``corpus.DraftCorpus``),
  built once and shared read-only by every decoder and batch row that uses it.
- :class:`WindowSource` (``"window"``): n-grams grown by the Jacobi lookahead window (``window.py``),
  which also contributes the window's own rows to each forward.
- :class:`CopySource` (``"copy"``): the continuation of the context's longest earlier match, as deep as
  ``copy_depth``, beside the other continuations of that match or shorter ones
  (``lookahead.cache.SuffixIndex``, a suffix automaton over the prompt and the output so far).
- :class:`ModelSource` (``"model"``): the model's own predictions from earlier forwards (every verified
  row's top-k successors of its input token, ``recycle.py``), grown into a tree from the last token.
  It learns from those rows (:meth:`ModelSource.learn_rows`), which only the decoder has.
- :class:`FrequentSource` (``"frequent"``): the context's most frequent tokens, side by side, drafted only on
  a step for which no other source drafts anything.

Each source has ``max_nodes`` and ``max_depth``, the most it drafts per step.
:func:`merge_proposals` unites the sources' trees into one :class:`~lookahead.draft.Draft`.
"""

from __future__ import annotations

import copy
import weakref

import numpy as np
from numba import njit

from . import kernels as K
from .cache import NgramTrie, SuffixIndex
from .draft import COPY, CORPUS, FREQUENT, MODEL, WINDOW, Draft, WindowRows
from .recycle import SuccessorTable
from .source import DraftSource, Proposal
from .window import LookaheadWindow


class TrieSource(DraftSource):
    """Drafts from an n-gram trie (``NgramTrie.propose``), matching up to ``max_match`` context tokens.

    ``per_request=True`` (the request's trie): ``start`` clears it and inserts the prompt.
    ``per_request=False`` (a shared store): ``start`` only begins a new stream (no n-gram spans two
    requests), and the prompt is not learned.
    """

    learns_lazily = True
    wide_nodes = 2  # config.STEP_NODES_LEVELS

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


class CorpusSource(TrieSource):
    """Drafts from a read-only store (``corpus.DraftCorpus.shared_store``): it learns nothing, so one store
    serves every decoder, thread and batch row at once (``NgramTrie.propose`` holds the store's lock)."""

    learns_lazily = False
    transient = ("trie",)  # the store: a pickle leaves it behind (tens of MB built), the owner binds it again (bind)

    def __init__(self, store: NgramTrie, max_match: int, max_nodes: int = 16, max_depth: int = 10):
        super().__init__(store, CORPUS, max_match, per_request=False, max_nodes=max_nodes, max_depth=max_depth)

    def bind(self, store: NgramTrie) -> None:
        """Draft from ``store`` (after a pickle, which leaves the store behind: the same corpus's store again)."""
        self.trie = store

    def __deepcopy__(self, memo) -> CorpusSource:
        """A copy (a copied decoder's) drafts from the same read-only store: it is shared by design, and copying it
        would cost its size (about 90 MB for the bundled corpus)."""
        other = copy.copy(self)  # which leaves the store behind, as a pickle does (transient): bound again here
        other.bind(self.trie)
        memo[id(self)] = other
        return other

    def start(self, prompt: np.ndarray, model=None) -> None:
        pass

    def learn(self, emitted: np.ndarray) -> None:
        pass


class WindowSource(DraftSource):
    """The Jacobi lookahead window: its rows join each forward, and the n-grams it harvests are drafted.

    ``W``, ``N``, ``G`` are ``LookaheadConfig.window_width``, ``window_ngram``, ``window_candidates``.
    """

    origin = WINDOW

    def __init__(self, width: int, ngram: int, candidates: int, max_match: int):
        self.width, self.ngram, self.candidates = width, ngram, candidates
        self.max_match = min(max_match, ngram - 1)
        self.trie = NgramTrie(max_n=ngram, capacity=max(1 << 14, 4 * ngram**2))
        self.window: LookaheadWindow | None = None
        self.max_nodes, self.max_depth = candidates * (ngram - 1), ngram - 1

    @property
    def max_rows(self) -> int:
        """Window rows plus the most drafted nodes per step."""
        return (self.candidates + self.width) * (self.ngram - 1)

    def start(self, prompt: np.ndarray, model=None) -> None:
        self.trie.clear()
        self.window = LookaheadWindow(self.width, self.ngram, prompt)

    def propose(self, context: np.ndarray, max_nodes: int, max_depth: int) -> Proposal | None:
        levels = self.ngram - 1
        if not self.candidates:
            return None
        tokens, parents, match = self.trie.propose(context, self.candidates * levels, min(max_depth, levels),
                                                   self.max_match, with_match=True)
        return Proposal(tokens, parents, match) if len(tokens) else None

    def rows(self) -> WindowRows:
        return WindowRows(*self.window.rows())

    def learn(self, emitted: np.ndarray) -> None:
        """The window learns from its own rows' outputs (:meth:`advance`), not from emitted tokens."""

    def advance(self, argmax: np.ndarray, n_emitted: int) -> None:
        """One Jacobi step from the window rows' argmax; the harvested n-grams enter the window's trie."""
        self.trie.insert_rows(self.window.advance(argmax, n_emitted))  # each n-gram a stream of its own


def _edges(*values) -> np.ndarray:
    """A source's bucket edges as a read-only array (``searchsorted`` on a tuple converts it at every call)."""
    edges = np.array(values)
    edges.flags.writeable = False
    return edges


class CopySource(DraftSource):
    """Longest-match copies of the request's own context (``lookahead.cache.SuffixIndex``).

    Each step it drafts the continuation of the context's longest suffix that occurred before (at
    that suffix's first occurrence), ``max_depth`` deep, and beside it up to ``branches - 1`` other
    continuations (other tokens that followed that suffix or a shorter one, longest first), each a
    chain of up to :attr:`branch_depth` tokens. A node's match is the context it would follow once its
    ancestors are accepted, which is what its estimate is conditioned on: its chain's suffix length
    plus its depth minus one. It is put on the acceptance estimates' scale: :attr:`buckets` ``(a, b)``
    give 1 below ``a`` tokens, 2 below ``b``, else 3 (a copy of a long passage is likelier to go on
    than one after a common phrase).

    Example: a suffix of 2 tokens matched, a chain 5 deep: matches 2, 3, 4, 5, 6 -> buckets
    1, 1, 2, 2, 2.
    """

    origin = COPY
    wide_nodes = 2  # config.STEP_NODES_LEVELS
    learns_lazily = True
    branch_depth = 8
    buckets = _edges(4, 16)

    def __init__(self, capacity: int, max_nodes: int, max_depth: int, branches: int):
        self.index = SuffixIndex(capacity)
        self.max_nodes, self.max_depth, self.branches = max_nodes, max_depth, branches

    def start(self, prompt: np.ndarray, model=None) -> None:
        self.index.clear()
        self.index.extend(prompt)

    def propose(self, context: np.ndarray, max_nodes: int, max_depth: int) -> Proposal | None:
        """``context`` is not read: the index holds the whole context."""
        # a node's match: the bucket (1, 2 or 3) of the context it follows once its ancestors are accepted
        tokens, parents, match = self.index.propose_buckets(max_nodes, max_depth, self.branches, self.branch_depth,
                                                            self.buckets)
        return Proposal(tokens, parents, match) if len(tokens) else None

    def learn(self, emitted: np.ndarray) -> None:
        self.index.extend(emitted)


class ModelSource(DraftSource):
    """The model's own predictions (Token Recycling): a best-first tree from the last two tokens through
    a :class:`~lookahead.recycle.SuccessorTable` of every verified row's top-``k`` successors. A node's
    match is its share of its parent's row (the row's top-k softmax) on the acceptance estimates'
    scale: :attr:`buckets` ``(a, b)`` give 1 below ``a``, 2 below ``b``, else 3.

    The table starts empty at each call unless ``keep``: then what earlier calls' rows taught stays
    while the calls decode the same model (a later row of a key replaces its earlier one). The rows of a batch
    share the decoder's one table (``table=``): what the model predicts after a token is the model's, whatever
    row it came from.
    """

    origin = MODEL
    wide_nodes, wide_depth = 2, 0.5  # config.STEP_NODES_LEVELS
    wants_rows = True
    transient = ("_model",)  # a weak reference does not pickle: an unpickled table starts anew
    buckets = _edges(0.95, 2.0)

    def __init__(self, k: int, max_nodes: int, max_depth: int, keep: bool = False, table: SuccessorTable | None = None):
        self.k, self.max_nodes, self.max_depth, self.keep = k, max_nodes, max_depth, keep
        self.table = SuccessorTable(k) if table is None else table  # a batch's rows share one
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
        # a node's match: 1 + how many of the bucket edges (a, b) its share reaches: 1 below a, 2 below b, else 3
        tokens, parents, match = self.table.propose_buckets(self.prev, self.last, max_nodes, max_depth, self.buckets)
        return Proposal(tokens, parents, match) if len(tokens) else None

    def learn(self, emitted: np.ndarray) -> None:
        for t in emitted[-2:].tolist():
            self.prev, self.last = self.last, t

    def learn_rows(self, draft: Draft, accepted_nodes, top_ids: np.ndarray, top_logits: np.ndarray) -> None:
        """A verified step's rows (call before :meth:`learn`): the last token's, then each draft node's, with
        their top-k successor ids int64[1 + n, k] and logits float[1 + n, k]. The accepted path's rows (whose
        context is the text's) are learned last, so they win a key several rows share."""
        path = np.array([0, *(1 + j for j in accepted_nodes)], dtype=np.int64)
        self.table.learn_step(self.prev, self.last, draft.tokens, draft.parents, path, top_ids, top_logits)


class FrequentSource(DraftSource):
    """The context's ``max_nodes`` most frequent tokens (the prompt's and the output's so far), each a child of the
    root: the draft of a step for which no other source has one (a ``fallback`` source: the policy asks it only
    then), as when the last token is new to the context, which is common in open text. Such a node is
    rarely accepted (7-10% of such steps in the benchmark's chat and code outputs, SmolLM2), but where a 2-row
    step costs less than a one-row one (a CPU BLAS whose one-row product takes a slower kernel) it makes the
    step cheaper as well; elsewhere the budget prices it like any node. Ties go to the token that reached the
    count first.

    Example: prompt ``[5, 7, 5, 9, 7, 5]``, ``max_nodes`` 2 -> the draft ``[5, 7]``, both children of the root;
    after the output ``[9, 9]``, ``[5, 9]`` (both 3, 5 there first); after ``[9, 9, 9]``, ``[9, 5]``.
    """

    origin = FREQUENT
    fallback = True
    learns_lazily = True  # counts only what a proposal will read: nothing on a call whose steps are all plain

    def __init__(self, max_nodes: int):
        self.max_nodes, self.max_depth = max_nodes, 1
        self.counts: dict[int, int] = {}
        self.top: list[int] = []  # the max_nodes most frequent tokens, most frequent first

    def start(self, prompt: np.ndarray, model=None) -> None:
        ids, first, counts = np.unique(prompt, return_index=True, return_counts=True)
        self.counts = dict(zip(ids.tolist(), counts.tolist()))
        order = np.lexsort((first, -counts))[: self.max_nodes]  # by count, then first occurrence
        self.top = ids[order].tolist()

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
            while i and counts[top[i - 1]] < c:  # strictly fewer: an equal count reached first stays ahead
                top[i - 1], top[i] = top[i], top[i - 1]
                i -= 1


def merge_proposals(proposals: list[tuple[int, Proposal]], window: WindowRows | None = None,
                    limit: int | None = None) -> Draft:
    """One draft from ``(origin, proposal)`` pairs; a path drafted by several sources appears once,
    with the origin, match and sibling rank (in that source's own tree) of the first source that
    drafted it, and its agreement (how many other sources drafted it); in depth-first order
    (``draft.py``), siblings in the order they were first drafted.

    Example: first = tokens ``[5, 6]``, parents ``[-1, 0]``; second = tokens ``[5, 7, 8]``,
    parents ``[-1, 0, -1]`` -> tokens ``[5, 6, 7, 8]``, parents ``[-1, 0, 0, -1]``, origins
    ``[first, first, second, second]``, agreement ``[1, 0, 0, 0]``. With ``limit`` 3, the merged tree's 3 shallowest
    nodes (``Draft.shallowest``, in the same call): tokens ``[5, 6, 8]``.
    """
    if not proposals:
        return Draft.empty(window)
    total = sum(len(p.tokens) for _, p in proposals)
    # the trees side by side: tree t holds nodes starts[t]:starts[t + 1], its parents local to it
    tokens, parents, match = np.empty(total, np.int64), np.empty(total, np.int64), np.empty(total, np.int64)
    origin, starts = np.empty(total, np.int8), np.empty(len(proposals) + 1, np.int64)
    a = 0
    for t, (o, p) in enumerate(proposals):
        b = a + len(p.tokens)
        starts[t] = a
        tokens[a:b], parents[a:b], match[a:b], origin[a:b] = p.tokens, p.parents, p.match, o  # a match: per node, or one
        a = b
    starts[-1] = a
    ints, origin = _merge(tokens, parents, origin, match, starts, total if limit is None else limit)
    return Draft(ints[0], ints[1], origin, ints[2], ints[3], ints[4], ints[5], window)


@njit(cache=True)
def _merge(tokens, parents, origin, match, starts, limit):
    """The union of the concatenated trees as a :class:`~lookahead.draft.Draft`'s first seven arrays, of its ``m``
    nodes, in two (a returned array costs its boxing): int64[6, m] (tokens, parents, match, depth, rank, agreement)
    and origin int8[m]. Per node: the first node of each path, in
    depth-first order (each node's children right after it, before its next sibling; siblings in the order first
    drafted), with its origin and match, its depth, its rank in its own tree (0: an only child, else 1 + its
    place among its siblings there), and how many later trees hold the same path. ``parents`` are per tree
    (local indices, parent-first); tree ``t`` holds nodes ``starts[t]:starts[t + 1]``. Of more than ``limit`` merged
    nodes only the ``limit`` shallowest are kept (equal depths: the earlier in that order first), as
    ``kernels.shallowest_nodes`` picks them."""
    n = tokens.shape[0]
    merged = np.empty(n, np.int64)  # node -> its path's first node
    first_child = np.full(n + 1, -1, np.int64)  # per first node (+1; 0: the root)
    next_sibling = np.full(n, -1, np.int64)
    depth = np.zeros(n, np.int64)
    is_first = np.zeros(n, np.bool_)
    tree = np.empty(n, np.int64)
    place = np.empty(n, np.int64)  # among its siblings in its own tree
    count = np.zeros(n, np.int64)  # children per node (global index), counted in its own tree
    agreement = np.zeros(n, np.int64)  # per first node: the later trees that hold its path
    voted = np.empty(n, np.int64)  # per first node: the last tree that holds its path (its own, at first)
    for t in range(starts.shape[0] - 1):
        roots = 0
        for i in range(starts[t], starts[t + 1]):
            tree[i] = t
            p = parents[i]
            if p >= 0:
                place[i] = count[starts[t] + p]
                count[starts[t] + p] += 1
            else:
                place[i] = roots
                roots += 1
            mp = merged[starts[t] + p] if p >= 0 else -1
            c = first_child[mp + 1]
            while c != -1 and tokens[c] != tokens[i]:
                c = next_sibling[c]
            if c == -1:
                c = i
                is_first[i] = True
                depth[i] = 1 if mp < 0 else depth[mp] + 1
                next_sibling[i] = first_child[mp + 1]
                first_child[mp + 1] = i
                voted[i] = t
            elif voted[c] != t:
                agreement[c] += 1
                voted[c] = t
            merged[i] = c
        for i in range(starts[t], starts[t + 1]):
            p = parents[i]
            siblings = count[starts[t] + p] if p >= 0 else roots
            place[i] = 0 if siblings == 1 else 1 + place[i]
    # depth-first preorder: a stack of first nodes; each list of children is latest-drafted first, so pushing
    # a list in its order pops the earliest-drafted child first
    order = np.empty(int(is_first.sum()), np.int64)
    stack = np.empty(n, np.int64)
    top = 0
    c = first_child[0]
    while c != -1:
        stack[top] = c
        top += 1
        c = next_sibling[c]
    m = 0
    while top:
        top -= 1
        v = stack[top]
        order[m] = v
        m += 1
        c = first_child[v + 1]
        while c != -1:
            stack[top] = c
            top += 1
            c = next_sibling[c]
    if m > limit:  # the shallowest ``limit`` (parents are shallower: the kept nodes stay a tree)
        order = order[K.shallowest_nodes(depth[order], limit)]
    new_index = np.full(n, -1, np.int64)
    for j in range(order.shape[0]):
        new_index[order[j]] = j
    m = order.shape[0]
    out = np.empty((6, m), np.int64)  # tokens, parents, match, depth, rank, agreement
    new_origin = np.empty(m, np.int8)
    for j in range(m):
        i = order[j]
        p = parents[i]
        out[0, j] = tokens[i]
        out[1, j] = new_index[merged[starts[tree[i]] + p]] if p >= 0 else -1
        out[2, j] = match[i]
        out[3, j] = depth[i]
        out[4, j] = place[i]
        out[5, j] = agreement[i]
        new_origin[j] = origin[i]
    return out, new_origin
