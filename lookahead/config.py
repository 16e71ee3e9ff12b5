"""`LookaheadConfig`: every knob of the decoder, validated once.

Terms used across the package (defined here once):

- *context*: the prompt plus every token emitted so far.
- *pending tokens*: emitted tokens whose keys/values are not in the KV cache yet (the whole
  prompt before the first step, then the last emitted token).
- *draft tree*: candidate continuations of the context, as token ids plus parent indices, every
  parent before its children (``parents[i] < i``; parent -1 means "child of the last context
  token"). A step's merged tree is in depth-first order (``draft.py``), so the path a step
  accepts is most often its first rows, whose KV entries then stay where they are.
- *step*: one forward pass of the target model over pending tokens + draft tree (+ window rows),
  followed by exact verification.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

WINDOW_AUTO_WIDTH = 8
"""The window's columns under ``window_width="auto"``: on the flat (GPU-like) curve, 4 held-out prompts per
workload, W=8/G=8 beside the other sources gave chat 2.23 tokens per call (no window 1.92, W=4 2.13) and left
code within 2% (``benchmarks/results/window.md``)."""

WINDOW_AUTO_COST = 1.5
"""``window_width="auto"`` runs the window only when a step of all the rows it and the tree can add costs at most
this many one-token steps on the call's cost curve: its rows then cost little beside what they find. A CPU's
curve (a 64-row step several one-token steps) keeps it off."""

STEP_NODES_AUTO = (63, 255)
"""``step_nodes="auto"``: a step verifies at most 63 draft nodes, or more where the call's cost curve prices a step
of all the rows they (and the window, when it runs) add at most :data:`STEP_NODES_WIDE_COST` one-token steps: a
GPU's. The wider counts are tried widest first (:data:`STEP_NODES_LEVELS`). On the flat (GPU-like) curve, 8 prompts
per workload, 127 nodes gave 2.84 / 4.88 / 5.09 tokens per call on chat / code editing / code completion with the
bundled heads, against 2.65 / 4.65 / 4.86 with 63 (``benchmarks/results/wide-steps.md``); a CPU's curve keeps 63,
and so does what the calibration measures."""

STEP_NODES_LEVELS = (255, 127)
"""The wider step sizes ``step_nodes="auto"`` tries, widest first. At the widest the draft sources draft wider
trees too (``DraftSource.limits``: the n-gram trie and the copy index twice the nodes, the model's predictions
twice the nodes and half again the depth, trained heads twice the nodes, 10 deep, 12 paths wide). On the flat curve
with the bundled heads that gave, over 127 nodes, 2.89 -> 3.08 / 4.99 -> 5.20 / 5.29 -> 5.50 tokens per call on
chat / code editing / code completion, and 3.46 -> 3.59 / 8.22 -> 8.73 / 4.87 -> 5.20 on 8 other prompts per
workload; neither the 255 nodes nor the wider trees alone had helped (``benchmarks/results/wide-steps.md``)."""

STEP_NODES_WIDE_COST = 1.25
"""See :data:`STEP_NODES_AUTO`."""

SELF_DRAFTS = ("none", "layer-skip", "early-exit", "low-rank")
"""``LookaheadConfig.self_draft`` values (the draft passes of ``selfspec.py``)."""
LINEAR_LAYOUTS = ("auto", "linear", "transposed", "onednn")
"""``LookaheadConfig.linear_layout`` values: measured per row count, always ``nn.Linear``, the other way round
for 2-16 rows, or oneDNN's linear for 2 rows and more (``linear_layout.py``)."""


def _bad(field: str, value, why: str) -> ValueError:
    return ValueError(f"LookaheadConfig.{field}={value!r} is invalid: {why}")


@dataclass(frozen=True)
class LookaheadConfig:
    """Settings of :class:`~lookahead.LookaheadDecoder`. The defaults suit every device: most users set nothing.

    The fields by how often they are worth touching:

    - **everyday**: ``step_nodes`` (most draft tokens a step verifies: the budget's ceiling), ``adaptive`` and
      ``cost_curve`` (how the budget prices a step), ``window_width`` (the Jacobi window: ``"auto"``, 0 or W);
    - **per source**: ``tree_*`` / ``ngram_size`` / ``max_match`` (the n-gram trie), ``copy_*`` (the
      longest-match copy), ``recycle_*`` (the model's own predictions), ``window_ngram`` / ``window_candidates``;
    - **expert**: capacities (``trie_capacity``, ``copy_capacity``), ``refine_cost``, ``batch_prefill``,
      ``linear_layout``, and the draft passes (``self_draft``, ``self_draft_size``, ``draft_depth``,
      ``draft_branches``, ``draft_cost``).

    The budget's own constants are :class:`~lookahead.tuning.BudgetTuning`'s (``LookaheadDecoder(tuning=...)``).

    Draft tree (from the n-gram trie of the prompt and output):

    - ``ngram_size``: longest n-gram the trie stores (``max_n``). A match of ``L`` context tokens
      can draft at most ``ngram_size - L`` tokens deep.
    - ``max_match``: longest context suffix looked up in the trie (longer first, shorter as fallback).
    - ``tree_nodes``: most draft tokens each n-gram store (the request's trie, and the shared one if
      any) proposes per step.
    - ``tree_depth``: most draft tokens on one branch.
    - ``trie_capacity``: node capacity of the trie; least-recently-used n-grams are evicted past it.

    Jacobi lookahead window (Fu et al. 2024; see ``window.py``), which grows n-grams that have not
    occurred yet, in the same forward pass:

    - ``window_width`` (the paper's W): columns of the window; 0 turns the window off; ``"auto"`` (default):
      :data:`WINDOW_AUTO_WIDTH` columns on a call whose cost curve makes its rows cheap (a step of every row
      the window and the tree can add costs at most :data:`WINDOW_AUTO_COST` one-token steps: a GPU, not a CPU),
      off elsewhere. Where it is on, the budget still decides per step whether its rows run.
    - ``window_ngram`` (N): n-gram size; the window keeps N - 1 levels of W guesses.
    - ``window_candidates`` (G): window n-grams verified per step (at most G * (N - 1) draft tokens).

    Budget (see ``budget.py``):

    - ``adaptive``: choose per step how many draft nodes to verify and whether to run the window,
      from the measured cost of a forward pass and online acceptance rates (``tree_nodes`` and the
      window settings are then upper bounds). ``False`` always verifies the full proposal.
    - ``cost_curve``: ``((k, seconds), ...)``, the time of a decoding step with ``k`` new tokens; given, it
      replaces the calibration (a few timed steps the first time a model runs on a machine: ``cost.py``).
    - ``refine_cost``: fold each step's measured forward time into the call's cost curve (off by
      default: decisions then depend only on the curve, not on the machine's momentary load; see
      ``cost.CostRefiner`` for how refinement avoids drifting).

    Longest-match copy (``lookahead.cache.SuffixIndex``, a suffix automaton over the prompt and output):

    - ``copy_nodes``: most draft tokens the copy source proposes per step; 0 turns it off.
    - ``copy_depth``: deepest copy chain (the continuation of the context's longest earlier match).
    - ``copy_branches``: continuations drafted side by side: the longest match's, then the other
      tokens that followed it or a shorter suffix (each a chain of up to 8 tokens).
    - ``copy_capacity``: context tokens the index holds; past it, it is rebuilt over the last half.

    The model's own predictions (Token Recycling, ``recycle.py``): every verified row's top-k
    successors, kept per input token (and per pair of tokens) and grown into a tree from the last token:

    - ``recycle_k``: successors kept per row (the decoder takes one ``topk`` over the verified rows
      after each forward); 0 turns the source off.
    - ``recycle_nodes``: most draft tokens it proposes per step; ``recycle_depth``: its deepest path.
    - ``recycle_keep``: keep the table across the calls of one decoder while they decode the same
      model (it fills with every call); False starts each call with an empty table.

    A step no source above drafts for (the last token new to the context, as often in open text):

    - ``fill_nodes``: the context's most frequent tokens it drafts instead, side by side
      (``proposer.FrequentSource``); the budget verifies them only where that pays, as on a CPU whose
      2-row step costs less than a one-row one (never with ``adaptive=False``); 0 turns it off.

    All sources together:

    - ``step_nodes``: most draft tokens one step verifies (the most probable ones are kept). ``"auto"``
      (default): 63 (64 rows per forward with the last token), or 255 or 127 where the call's cost curve is flat
      that far (:data:`STEP_NODES_AUTO`, :data:`STEP_NODES_LEVELS`: at 255 the sources draft wider trees too;
      never in a batch, nor past a static cache's largest bucket).

    Example::

        LookaheadConfig(tree_nodes=8, tree_depth=6)   # a smaller tree for a slow CPU

    Draft passes (``selfspec.py``): a cheaper forward drafts a greedy chain from its own KV cache; off by
    default (on the 2-core CPUs measured they did not pay, see ``benchmarks/results/selfspec.md``):

    - ``self_draft``: ``"none"``, ``"layer-skip"`` (the target with some decoder layers skipped),
      ``"early-exit"`` (its first layers, then its final norm and head) or ``"low-rank"`` (truncated-SVD
      factors of its linear layers); Llama-family layouts only.
    - ``self_draft_size``: fraction of layers kept (layer skip) or run (early exit), or the rank as a fraction
      of each matrix's smaller side (low rank); 0 chooses it by a calibration on the first prompt.
    - ``draft_depth``: deepest chain a draft pass proposes (also for ``LookaheadDecoder(draft_model=...)``).
    - ``draft_branches``: tokens drafted per depth (the chain's, plus runner-ups as leaves).
    - ``draft_cost``: one draft forward's cost as a fraction of one target forward, which prices the draft
      passes against the cost curve; 0 measures it once per model.

    Batches (``batch.py``):

    - ``batch_prefill``: ``"auto"`` prefills left-padded prompts of different lengths in groups of similar
      length (each group padded only to its own longest row) when the cost curve puts that below one
      forward of the whole padded batch (on a CPU; never with a flat curve, as on a GPU); ``"padded"``:
      always one padded forward, as plain ``generate``.

    Linear layers on a CPU (``linear_layout.py``):

    - ``linear_layout``: how a step of several rows computes the model's ``nn.Linear`` layers. ``"auto"``
      (default): the calibration times the steps in each layout, ``nn.Linear``'s ``x @ W^T``, the other way round,
      ``(W @ x^T)^T``, for 2 to 16 rows (some BLAS builds are far slower for a few rows than for one), and for fp32
      weights oneDNN's linear, and each calibrated step size takes the one that was cheapest there (by at least
      5% against ``nn.Linear``); nothing changes where a cost curve is given or not
      measured, in a model whose linear layers hold fewer than 16M weights, and in a bf16 or fp16 one (their
      kernels are already fast for a few rows). ``"linear"``: always
      ``nn.Linear``. ``"transposed"``: always the other way round for 2 to 16 rows. ``"onednn"``: always oneDNN's
      linear for 2 rows and more (fp32 weights and a torch built with oneDNN, else the call raises
      ``ValueError``). One-row steps always go through ``nn.Linear``, as in plain ``generate``; only on a CPU.
    """

    ngram_size: int = 12
    max_match: int = 3
    tree_nodes: int = 16
    tree_depth: int = 10
    trie_capacity: int = 1 << 18
    window_width: int | str = "auto"
    window_ngram: int = 4
    window_candidates: int = 8
    adaptive: bool = True
    cost_curve: tuple | None = None
    refine_cost: bool = False
    copy_nodes: int = 56
    copy_depth: int = 32
    copy_branches: int = 4
    copy_capacity: int = 1 << 16
    step_nodes: int | str = "auto"
    recycle_k: int = 8
    recycle_nodes: int = 63
    recycle_depth: int = 16
    recycle_keep: bool = True
    fill_nodes: int = 3
    self_draft: str = "none"
    self_draft_size: float = 0.0
    draft_depth: int = 6
    draft_branches: int = 1
    draft_cost: float = 0.0
    batch_prefill: str = "auto"
    linear_layout: str = "auto"

    @property
    def step_nodes_range(self) -> tuple[int, int]:
        """(the most draft nodes a step verifies until a call's cost curve says more pay, the most it may verify):
        :data:`STEP_NODES_AUTO` under ``"auto"``, else ``step_nodes`` twice."""
        return STEP_NODES_AUTO if self.step_nodes == "auto" else (self.step_nodes, self.step_nodes)

    @property
    def window_columns(self) -> int:
        """The window's columns W when it runs (``"auto"``: :data:`WINDOW_AUTO_WIDTH`), 0 when off."""
        return WINDOW_AUTO_WIDTH if self.window_width == "auto" else self.window_width

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("bool", bool) and not isinstance(value, bool):
                raise _bad(f.name, value, "must be a bool")
            if f.type in ("int", int) and (not isinstance(value, int) or isinstance(value, bool)):
                raise _bad(f.name, value, "must be an int")
        if self.window_width != "auto" and (not isinstance(self.window_width, int) or isinstance(self.window_width, bool)):
            raise _bad("window_width", self.window_width, "must be an int or 'auto'")
        # Upper bounds refuse absurd values here rather than as a MemoryError or a misleading
        # message later (e.g. window_width=10**6 asked numpy for 931 GiB on the first step).
        max_ngram = 64  # each token updates ngram_size trie nodes and capacity needs 4 * ngram_size**2
        max_tree = 256  # draft tokens per store per step: one forward packs them with a k x k mask
        max_window_rows = 512  # W*(N-1) + G*(N-1) window tokens per forward: a few hundred at most
        max_capacity = 1 << 27  # 64-72 bytes preallocated per node: ~9 GiB (int32 node ids would allow 2**31)
        if self.ngram_size < 2:
            raise _bad("ngram_size", self.ngram_size, "must be >= 2")
        if self.ngram_size > max_ngram:
            raise _bad("ngram_size", self.ngram_size, f"must be <= {max_ngram}")
        if not 1 <= self.max_match <= self.ngram_size - 1:
            raise _bad("max_match", self.max_match, f"must be in [1, ngram_size - 1 = {self.ngram_size - 1}]")
        if not 0 <= self.tree_nodes <= max_tree:
            raise _bad("tree_nodes", self.tree_nodes,
                       f"must be in [0, {max_tree}] (0 turns the draft tree off)")
        if not 0 <= self.tree_depth <= max_ngram:  # no draft is deeper than an n-gram
            raise _bad("tree_depth", self.tree_depth,
                       f"must be in [0, {max_ngram}] (0 turns the draft tree off)")
        if not 0 <= self.window_columns <= max_window_rows:
            raise _bad("window_width", self.window_width,
                       f"must be in [0, {max_window_rows}] (0 turns the window off) or 'auto'")
        if not 2 <= self.window_ngram <= max_ngram:
            raise _bad("window_ngram", self.window_ngram, f"must be in [2, {max_ngram}]")
        if not 0 <= self.window_candidates <= max_window_rows:
            raise _bad("window_candidates", self.window_candidates, f"must be in [0, {max_window_rows}]")
        w, g, levels = self.window_columns, self.window_candidates, self.window_ngram - 1
        if w and (w + g) * levels > max_window_rows:
            # Worked example: W=100, N=4, G=4 packs 100*3 + 4*3 = 312 rows (allowed); W=200 packs 612.
            name = "window_width" if w >= g else "window_candidates"
            raise _bad(name, getattr(self, name),
                       f"the window would pack W*(N-1) + G*(N-1) = {w}*{levels} + {g}*{levels} = "
                       f"{(w + g) * levels} tokens into each forward, more than {max_window_rows}: "
                       "lower window_width, window_ngram or window_candidates")
        if self.cost_curve is not None:
            try:
                points = tuple((int(k), float(t)) for k, t in self.cost_curve)
            except (TypeError, ValueError):
                raise _bad("cost_curve", self.cost_curve, "must be ((k, seconds), ...)") from None
            if not points or any(k < 1 or t <= 0 for k, t in points):
                raise _bad("cost_curve", self.cost_curve, "needs points with k >= 1 and seconds > 0")
            object.__setattr__(self, "cost_curve", points)
        max_copy = 256  # copy tokens per step, and its depth: one forward packs them with a k x k mask
        if not 0 <= self.copy_nodes <= max_copy:
            raise _bad("copy_nodes", self.copy_nodes, f"must be in [0, {max_copy}] (0 turns the copy source off)")
        if not 1 <= self.copy_depth <= max_copy:
            raise _bad("copy_depth", self.copy_depth, f"must be in [1, {max_copy}]")
        if not 1 <= self.copy_branches <= 64:
            raise _bad("copy_branches", self.copy_branches, "must be in [1, 64]")
        if not 16 <= self.copy_capacity <= 1 << 28:  # about 110 bytes preallocated per token: ~30 GiB at most
            raise _bad("copy_capacity", self.copy_capacity, f"must be in [16, {1 << 28}]")
        if self.step_nodes != "auto" and (not isinstance(self.step_nodes, int) or isinstance(self.step_nodes, bool)
                                          or not 0 <= self.step_nodes <= 1024):
            raise _bad("step_nodes", self.step_nodes, "must be 'auto' or an int in [0, 1024] (0: every step is plain)")
        if not 0 <= self.recycle_k <= 64:
            raise _bad("recycle_k", self.recycle_k, "must be in [0, 64] (0 turns the model's predictions off)")
        if not 1 <= self.recycle_nodes <= 256:
            raise _bad("recycle_nodes", self.recycle_nodes, "must be in [1, 256]")
        if not 1 <= self.recycle_depth <= 64:
            raise _bad("recycle_depth", self.recycle_depth, "must be in [1, 64]")
        if not 0 <= self.fill_nodes <= 64:
            raise _bad("fill_nodes", self.fill_nodes, "must be in [0, 64] (0 turns the frequent tokens off)")
        min_capacity = 4 * self.ngram_size * self.ngram_size
        if not min_capacity <= self.trie_capacity <= max_capacity:
            raise _bad("trie_capacity", self.trie_capacity,
                       f"must be in [4 * ngram_size**2 = {min_capacity}, {max_capacity}]")
        if self.self_draft not in SELF_DRAFTS:
            raise _bad("self_draft", self.self_draft, f"must be one of {SELF_DRAFTS}")
        for name in ("self_draft_size", "draft_cost"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _bad(name, value, "must be a number")
        if not 0.0 <= self.self_draft_size <= 1.0:
            raise _bad("self_draft_size", self.self_draft_size, "must be in [0, 1] (0: chosen by calibration)")
        if not 1 <= self.draft_depth <= 64:
            raise _bad("draft_depth", self.draft_depth, "must be in [1, 64]")
        if not 1 <= self.draft_branches <= 8:
            raise _bad("draft_branches", self.draft_branches, "must be in [1, 8]")
        if not 0.0 <= self.draft_cost <= 100.0:
            raise _bad("draft_cost", self.draft_cost, "must be in [0, 100] (0: measured)")
        if self.batch_prefill not in ("auto", "padded"):
            raise _bad("batch_prefill", self.batch_prefill, "must be 'auto' or 'padded'")
        if self.linear_layout not in LINEAR_LAYOUTS:
            raise _bad("linear_layout", self.linear_layout, f"must be one of {LINEAR_LAYOUTS}")
