"""An NgramTrie from token streams saved by generate.py (one stream per answer).

    python benchmarks/results/global-store/build.py ANSWERS.npz OUT.trie [MAX_N] [CAPACITY]
"""
import sys

import numpy as np

from lookahead.cache import NgramTrie

data = np.load(sys.argv[1])
max_n = int(sys.argv[3]) if len(sys.argv) > 3 else 8
cap = int(sys.argv[4]) if len(sys.argv) > 4 else 1 << 20
trie = NgramTrie(max_n=max_n, capacity=cap)
a = 0
for n in data["lengths"]:
    trie.reset_stream()
    trie.insert(data["tokens"][a:a + n])
    a += n
trie.reset_stream()
trie.save(sys.argv[2], vocab_size=49152)
print(trie, "streams", len(data["lengths"]), "tokens", a)
