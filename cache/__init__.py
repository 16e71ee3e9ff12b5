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
>>> from lookahead.cache import NgramTrie
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
inserted, the least recently used n-grams are evicted (see ``kernels.evict``). However many tokens
pass through, a trie holds at most ``capacity`` nodes in the same 64 to 72 bytes per node of
capacity allocated by the constructor.

A store across requests
-----------------------
``LookaheadDecoder(trie=NgramTrie(...))`` shares one trie across calls. The rule: *outputs persist,
prompts fade*. The shared trie learns only the tokens each request generates (one stream per
request); a prompt's n-grams go to that request's own trie and are gone with it. The shared trie
stays bounded by its capacity, the least recently used n-grams making room.

Persistence
-----------
``trie.save(path, vocab_size=..., tokenizer_id=tokenizer_identity(tok))`` writes a versioned,
checksummed file atomically (temporary file, fsync, rename: a crash leaves the old file or the new
one, never a half-written one). ``NgramTrie.load(path, vocab_size=..., tokenizer_id=...)`` returns a
new trie, ``trie.load_into(path, ...)`` replaces a trie's contents. A file that is not a store,
truncated, corrupt or of a newer format raises :class:`TrieFileError`; one for another vocabulary,
tokenizer or ``max_n`` raises :class:`TrieMismatchError` (a ``TrieFileError``); both are
``ValueError`` subclasses, and the in-memory trie is untouched when they are raised. The file holds the
n-grams with their counts and last-used steps and the step counter, so a loaded trie proposes and
evicts exactly as the saved one would; streams are not saved (a load starts new ones). Format:
:mod:`lookahead.cache.persist`.

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "store.ngt")
>>> trie.save(path, vocab_size=100, tokenizer_id="demo")
>>> NgramTrie.load(path, vocab_size=100, tokenizer_id="demo").propose([5, 1, 2], 2, 8)[0].tolist()
[3, 1]
>>> NgramTrie.load(path, vocab_size=50000)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
lookahead.cache.persist.TrieMismatchError: ...: the store was saved for a vocabulary of 100 tokens, not 50000: ...

Threads
-------
Every public method holds the trie's lock, so one trie can be shared by decoders running in
several threads and stays consistent. Each thread has its own *stream*: ``insert`` appends to the
calling thread's stream and ``reset_stream`` restarts it, so two requests decoded at the same time
never form n-grams across each other; the result is the same set of n-grams with the same counts
as decoding them one after the other. (A thread that pauses keeps its place, re-found by lookup
when it inserts again, minus any of its open n-grams evicted meanwhile.) Eviction never frees the
n-grams the inserting thread's next token extends; when threads interleave at a capacity near the
minimum, it may free more recent n-grams than one stream would (``kernels.evict``). ``clear`` and
``load_into`` restart every thread's stream.
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
