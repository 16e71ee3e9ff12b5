"""The n-gram stores, both proposing draft trees ``(tokens, parents)``: breadth-first, ``parents[i]`` -1 under the
root, else an index ``< i``. :class:`SuffixIndex` (``suffix.py``) copies from one request's context;
:class:`NgramTrie`, a bounded trie of token-id n-grams, drafts from whatever was inserted (shared across calls).

NgramTrie terms: token ids are inserted as *streams* (``insert`` appends, ``reset_stream`` starts a new one,
``clear`` also empties the trie); each inserted token gets the next *step* (1, 2, ...). An *n-gram* is 1..``max_n``
consecutive tokens of one stream: a node with ``count`` (occurrences) and ``last_used`` (the step that ended its
latest occurrence). The *match* is the longest suffix of at most ``max_match`` (default ``max_n - 1``) context
tokens whose node has children; ``propose`` picks up to ``max_nodes`` nodes below it, at most ``max_depth`` deep,
best-first by ``score(child) = score(parent) * count(child) / (sum of count over parent's children)``, 1 at the match
(ties: shallower, then most recently used); siblings are output by count, then recency.

Example: ``(5, 1, 2)`` is no node, so the match is ``(1, 2)``, followed by 3 twice and 4 once: scores 2/3 and 1/3,
which the only children ``(1, 2, 3, 1)`` and ``(1, 2, 4, 1)`` inherit. With two nodes, the 2/3 path ``3 -> 1`` wins.

>>> from lookahead.cache import NgramTrie
>>> trie = NgramTrie(max_n=4, capacity=64)
>>> trie.insert([1, 2, 3, 1, 2, 4, 1, 2, 3])
>>> tokens, parents = trie.propose([5, 1, 2], max_nodes=8, max_depth=8)
>>> tokens.tolist(), parents.tolist()
([3, 4, 1, 1], [-1, -1, 0, 1])
>>> tokens, parents = trie.propose([5, 1, 2], max_nodes=2, max_depth=8)
>>> tokens.tolist(), parents.tolist()
([3, 1], [-1, 0])

When fewer than ``max_n`` slots are free before a token is inserted, the least recently used n-grams are evicted
(``kernels.evict``). ``save`` / ``load`` keep a trie in a file (:mod:`lookahead.cache.persist`).

Threads: every public method holds the trie's lock, and ``insert`` and ``reset_stream`` act on the calling thread's
own stream, so concurrent requests yield the n-grams and counts of decoding them one after the other. A paused
thread's place is re-found by lookup when it inserts again, minus any of its open n-grams evicted meanwhile.
Eviction never frees the n-grams the inserting thread's next token extends, but near the minimum capacity
interleaved threads may lose more recent ones than one stream would. ``clear`` and ``load_into`` restart every
thread's stream.
"""

from .suffix import SuffixIndex
from .trie import NgramTrie

_PERSIST = ("FORMAT_VERSION", "TrieFileError", "TrieMismatchError", "tokenizer_identity")


def __getattr__(name: str):  # the file format is imported when a store is saved or loaded, not before
    if name in _PERSIST:
        from . import persist

        return getattr(persist, name)
    raise AttributeError(f"module 'lookahead.cache' has no attribute {name!r}")


__all__ = ["NgramTrie", "SuffixIndex", "TrieFileError", "TrieMismatchError", "tokenizer_identity", "FORMAT_VERSION"]
