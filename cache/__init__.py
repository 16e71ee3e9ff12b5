"""The n-gram store: a bounded trie of token-id n-grams that proposes draft trees.

Terms
-----
stream
    A sequence of token ids inserted one after another (``NgramTrie.insert`` appends to the
    current stream; ``reset_stream`` starts a new one, ``clear`` also empties the trie). Every
    inserted token gets the next *step* number (1, 2, ...), which serves as its timestamp.
n-gram
    A run of 1..``max_n`` consecutive tokens of one stream (never across a stream boundary). Each
    is a node of the trie, reached from the root by its tokens, and carries ``count`` (how often
    it occurred) and ``last_used`` (the step of the token that ended its latest occurrence).
match
    For a context, the longest suffix of at most ``max_match`` (default ``max_n - 1``) tokens
    whose node exists and has children: its children are what followed that suffix before.
draft tree
    What ``propose`` returns: up to ``max_nodes`` nodes below the match, at most ``max_depth``
    deep, as ``(tokens, parents)`` in breadth-first order; ``parents[i] == -1`` marks a child of
    the match, otherwise ``parents[i] < i`` is the index of the node's parent in the output.
score
    The empirical probability of the path from the match to a node:
    ``score(child) = score(parent) * count(child) / (sum of count over parent's children)``,
    with score 1 at the match. The draft tree is the best-first pick of the highest scores
    (ties: shallower first, then most recently used); siblings are output by count, then
    recency.

Worked example
--------------
>>> from cache import NgramTrie
>>> trie = NgramTrie(max_n=4, capacity=64)
>>> trie.insert([1, 2, 3, 1, 2, 4, 1, 2, 3])

The context ``[5, 1, 2]`` has no node ``(5, 1, 2)``, so the match is ``(1, 2)``. It was followed
by 3 twice and by 4 once: score(3) = 2/3, score(4) = 1/3. Below them ``(1, 2, 3, 1)`` and
``(1, 2, 4, 1)`` are the only children, so they inherit 2/3 and 1/3. Depth is limited to
``max_n - 2 = 2`` below a match of length 2.

>>> tokens, parents = trie.propose([5, 1, 2], max_nodes=8, max_depth=8)
>>> tokens.tolist(), parents.tolist()
([3, 4, 1, 1], [-1, -1, 0, 1])

With two nodes, the 2/3 path ``3 -> 1`` beats the 1/3 branch ``4``:

>>> tokens, parents = trie.propose([5, 1, 2], max_nodes=2, max_depth=8)
>>> tokens.tolist(), parents.tolist()
([3, 1], [-1, 0])

Memory is fixed at construction: when fewer than ``max_n`` node slots are free before a token is
inserted, the least recently used n-grams are evicted (see ``kernels.evict``).
"""

from .trie import NgramTrie

__all__ = ["NgramTrie"]
