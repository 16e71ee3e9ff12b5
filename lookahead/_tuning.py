"""Every tuning constant of the decoder, in one frozen dataclass. Private: users set ``LookaheadConfig``.

Tests and experiments pass another one: ``LookaheadDecoder(_tuning=Tuning(tree_nodes=8))``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Tuning:
    """The constants, grouped by the part of the step that reads them; each validated on construction."""

    # -- the n-gram tries (the request's, a shared store's, the corpus's) --
    ngram_size: int = 12  # longest n-gram a trie keeps; a match of L tokens drafts at most ngram_size - L deep
    max_match: int = 3  # longest context suffix looked up (shorter ones as fallback)
    tree_nodes: int = 16  # most nodes each trie drafts per step
    tree_depth: int = 10
    trie_capacity: int = 1 << 18  # nodes of the request's trie (least recently used evicted past it)
    row_trie_capacity: int = 1 << 16  # a batch row's own trie
    corpus_ngram: int = 8  # n of a corpus's read-only store
    # -- the longest-match copy (cache.SuffixIndex) --
    copy_nodes: int = 56  # 0 turns it off
    copy_depth: int = 32
    copy_branches: int = 4  # continuations side by side: the longest match's, then others
    copy_branch_depth: int = 8
    copy_capacity: int = 1 << 16  # context tokens indexed; past it, rebuilt over the last half
    copy_buckets: tuple = (4, 16)  # a node's match bucket: 1 below 4 tokens matched, 2 below 16, else 3
    # -- the model's own predictions (Token Recycling) --
    recycle_k: int = 8  # successors kept per verified row; 0 turns the source off
    recycle_nodes: int = 63
    recycle_depth: int = 16
    recycle_keep: bool = True  # the table lives across a decoder's calls on one model
    recycle_calibration: float = 0.62  # P(a drafted successor follows) / its share
    recycle_buckets: tuple = (0.95, 2.0)  # a node's bucket by its share
    prompt_rows_cost: float = 2.0  # the prompt's rows teach the table when 64 rows cost at most this many 1-row steps
    # -- the context's frequent tokens, on a step nothing else drafts for --
    fill_nodes: int = 3
    # -- the Jacobi window (W columns, N-gram, G candidates) --
    window_auto_width: int = 8  # W under window="auto"
    window_auto_cost: float = 1.5  # "auto" runs it where a step of all its rows costs at most this many 1-row steps
    window_ngram: int = 4
    window_candidates: int = 8
    window_draws: int = 256  # fresh guesses drawn at a time
    # -- how many nodes a step may verify --
    step_nodes_auto: tuple = (63, 255)  # "auto": 63, or more where the curve is flat that far
    step_nodes_levels: tuple = (255, 127)  # the wider sizes tried, widest first
    step_nodes_wide_cost: float = 1.25  # "flat that far": a step of all the rows costs at most this many 1-row steps
    # -- the budget: acceptance estimates --
    adaptive: bool = True  # False: no budget, every step verifies the whole (shallowest-cut) draft
    priors: tuple = ((1.0, 0.5), (0.5, 1.0), (0.15, 1.35))  # Beta prior per sibling rank: only child, first, later
    match_scale: tuple = (0.5, 0.9, 1.3)  # the prior's mean per match bucket
    depth_cells: int = 8
    rank_cells: int = 4
    pool_weight: float = 2.0  # trials a cell's pooled-over-depths mean weighs as
    depth_lift: float = 0.95  # a deep cell borrows 1 - (1 - pooled) * depth_lift ** (depth - 1)
    decay: float = 0.97  # per-step decay of every count
    # -- the budget: the copy belief (one number per call coupling all cells) --
    belief_prior: float = 0.9
    belief_off_scale: float = 0.3
    belief_relax: float = 0.9
    belief_limit: float = 6.0
    # -- the budget: choices --
    margin: float = 1.05  # a drafted step must beat a plain one by this factor in expected tokens per second
    probe_every: int = 64  # a step that would verify nothing verifies its likeliest node this often
    window_probe_every: int = 16
    window_gain_start: float = 1.0
    window_gain_keep: float = 0.9
    learn_slope_cpu: float = 0.1  # a learned curve's price of a size not yet seen: one-row steps per extra token
    learn_slope_gpu: float = 0.02
    learn_keep_after: int = 16  # a learned curve is kept on disk once this many steps of a process taught it
    # -- batches --
    hole_slack: int = 16  # hole columns past the longest row before the cache is re-aligned
    copy_seconds_per_byte: float = 1 / 4e9  # a whole-cache copy before one was measured
    prefill_margin: float = 1.1  # grouped prefill must be estimated this much cheaper than one padded forward
    grouped_prefill: bool = True
    # -- static caches --
    buckets: tuple = (1, 8, 16, 32, 64, 128, 256)  # a step's forward rows after the prompt's
    # -- KV cache --
    grow_columns: int = 64  # spare columns a growing layer allocates
    max_moves: int = 2  # runs of kept columns moved by slices; more take one gather
    # -- the cost curve's calibration (``python -m lookahead warmup --calibrate``; a call learns from its steps) --
    calibrate: bool = False  # time the model's steps before the call, and plan the CPU layouts from the timings
    rounds: int = 2
    agreement: float = 1.2  # a size's two fastest timings must agree within this
    drift: float = 1.5  # a round whose bracketing 1-row timings differ more is not used
    attempts: int = 4
    max_seconds: float = 10.0
    stop_ratio: float = 6.0  # the first round stops at a size this many 1-row steps dear
    retry_after: float = 60.0  # a provisional curve is measured again after this many seconds (doubling)
    progress_delay: float = 1.0
    # -- draft passes (lookahead.passes) --
    self_draft_size: float = 0.0  # 0: chosen by a calibration on the first prompt
    draft_depth: int = 6
    draft_branches: int = 1
    draft_cost: float = 0.0  # one draft forward's cost / one target forward's; 0: measured
    # -- CPU linear layouts (lookahead.cpu) --
    linear_layout: str = "auto"  # "auto", "linear" (off), "transposed", "onednn"
    layout_max_rows: int = 16
    layout_pays_below: float = 0.95
    layout_min_weights: int = 1 << 24
    # -- DecodeStats.explain --
    explain_paid: float = 1.2
    explain_costly: tuple = (1.2, 1.5)

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"Tuning.{name}={getattr(self, name)!r} is invalid: {why}")

        kinds = {bool: (bool, "a bool"), int: (int, "an int >= 0"), float: ((int, float), "a number >= 0")}
        for f in fields(self):
            value, default = getattr(self, f.name), f.default
            types, kind = kinds.get(type(default), (type(default), f"a {type(default).__name__}"))
            numeric = type(default) in (int, float)
            if not isinstance(value, types) or numeric and (isinstance(value, bool) or not value >= 0):
                raise bad(f.name, f"must be {kind}")
        for name, low, high in (("ngram_size", 2, 64), ("window_ngram", 2, 64), ("depth_cells", 1, 64),
                                ("rank_cells", 1, 64), ("probe_every", 1, 1 << 30), ("window_probe_every", 1, 1 << 30),
                                ("tree_nodes", 0, 256), ("tree_depth", 0, 64), ("copy_nodes", 0, 256),
                                ("copy_depth", 1, 256), ("copy_branches", 1, 64), ("copy_branch_depth", 1, 256),
                                ("recycle_k", 0, 64), ("recycle_nodes", 1, 256), ("recycle_depth", 1, 64),
                                ("fill_nodes", 0, 64), ("window_auto_width", 1, 128), ("window_candidates", 0, 128),
                                ("corpus_ngram", 2, 64), ("copy_capacity", 16, 1 << 28), ("draft_depth", 1, 64),
                                ("draft_branches", 1, 8), ("layout_max_rows", 2, 1 << 12), ("decay", 0, 1),
                                ("belief_relax", 0, 1), ("window_gain_keep", 0, 1), ("self_draft_size", 0, 1)):
            if not low <= getattr(self, name) <= high:
                raise bad(name, f"must be in [{low}, {high}]")
        if not 1 <= self.max_match < self.ngram_size:
            raise bad("max_match", f"needs 1 <= max_match < ngram_size ({self.ngram_size})")
        if not 4 * self.ngram_size ** 2 <= self.trie_capacity <= 1 << 27:
            raise bad("trie_capacity", f"must be in [4 * ngram_size**2 = {4 * self.ngram_size ** 2}, {1 << 27}]")
        for name in ("depth_lift", "learn_slope_cpu", "learn_slope_gpu"):
            if not 0 < getattr(self, name) <= 1:
                raise bad(name, "must be in (0, 1]")
        for name in ("belief_prior", "belief_off_scale"):
            if not 0 < getattr(self, name) < 1:
                raise bad(name, "must be in (0, 1)")

        def numbers(value, count=None, positive=True, increasing=False) -> bool:
            try:
                xs = [float(x) for x in value]
            except (TypeError, ValueError):
                return False
            return ((count is None or len(xs) == count) and bool(xs) and all(x > 0 or not positive for x in xs)
                    and (not increasing or all(a < b for a, b in zip(xs, xs[1:]))))

        if not all(isinstance(p, tuple) and numbers(p, 2) for p in self.priors) or not self.priors:
            raise bad("priors", "needs one (a > 0, b > 0) pair per rank")
        if not numbers(self.match_scale, 3):
            raise bad("match_scale", "needs three positive factors (match 1, 2, 3+)")
        for name in ("copy_buckets", "recycle_buckets", "explain_costly"):
            if not numbers(getattr(self, name), 2, increasing=name != "explain_costly"):
                raise bad(name, "needs two positive numbers, increasing")
        if not numbers(self.step_nodes_auto, 2) or self.step_nodes_auto[0] > self.step_nodes_auto[1]:
            raise bad("step_nodes_auto", "needs (narrow, wide) with 0 < narrow <= wide")
        if not numbers(self.step_nodes_levels) or list(self.step_nodes_levels) != sorted(self.step_nodes_levels,
                                                                                        reverse=True):
            raise bad("step_nodes_levels", "needs positive sizes, widest first")
        if not numbers(self.buckets, increasing=True) or self.buckets[0] != 1:
            raise bad("buckets", "needs increasing sizes from 1")
        if self.linear_layout not in ("auto", "linear", "transposed", "onednn"):
            raise bad("linear_layout", "must be 'auto', 'linear', 'transposed' or 'onednn'")


DEFAULT = Tuning()
