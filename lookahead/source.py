"""The draft-source protocol: what every source of draft trees offers the draft policy.

A *source* proposes a tree of candidate tokens after the context and learns from what the decoder
emits. The policy (``policy.py``) drives every source through :class:`DraftSource`'s methods only;
what a source needs beyond the emitted tokens it declares with a class attribute, and the decoder
hands it over after each verified step:

- ``priced``: proposing costs forwards of its own (a draft pass, trained heads): the policy first asks
  :meth:`DraftSource.priced_depth` how deep drafting pays this step on the call's cost curve (0: skip).
- ``wants_rows``: it learns from every verified row's top-k successors (:meth:`DraftSource.learn_rows`).
- ``wants_hidden``: it learns from the final hidden states of the step's accepted path
  (:meth:`DraftSource.observe_hidden`): the input of the model's output embedding (after the final
  norm) at each row whose logits gave an emitted token, the last of them the row of the step's last one.
- ``learns_lazily``: its state is a function of the token stream alone, so :meth:`DraftSource.learn` may get
  several steps' tokens at once, just before it next proposes (or when the call ends): steps that draft
  nothing then cost it nothing.

Terms (context, draft tree) are defined in ``config.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Proposal:
    """One source's tree: ``tokens`` int64[n], ``parents`` int64[n] (parent-first: ``parents[i] < i``), and ``match``:
    how many context tokens the source matched to draft it, for every node (an int), or per node
    (int64[n]); the acceptance estimates bucket it (1, 2, 3+).

    Example: the chain ``5 -> 6`` after a 2-token match: ``Proposal(array([5, 6]), array([-1, 0]), 2)``.
    """

    tokens: np.ndarray
    parents: np.ndarray
    match: int | np.ndarray


class DraftSource:
    """Base class of every draft source. A subclass sets ``origin`` (an index into ``draft.ORIGINS``),
    ``max_nodes`` and ``max_depth`` (the most it drafts per step) and implements :meth:`propose`; the
    rest has do-nothing defaults.

    - ``start(prompt, model)``: a call begins with this prompt (int64[L]) on this target model.
    - ``propose(context, max_nodes, max_depth) -> Proposal | None``: a tree continuing ``context``
      (int64[c], the context's last tokens, at most ``LookaheadConfig.max_match``).
    - ``learn(emitted)``: the step emitted these tokens (int64[k]).

    A ``fallback`` source is asked only on a step no other source drafts for, and only when a budget prices
    what it drafts (``policy.DraftPolicy.draft``).
    """

    origin: int
    max_nodes: int
    max_depth: int
    wide: bool = False
    """Whether this call's steps are the widest ``step_nodes="auto"`` takes (set by the policy at each call's
    start): then :meth:`limits` gives ``wide_nodes`` times the nodes and ``wide_depth`` more of the depth."""
    wide_nodes: int = 1
    wide_depth: float = 0.0
    priced: bool = False
    wants_rows: bool = False
    wants_hidden: bool = False
    learns_lazily: bool = False
    fallback: bool = False
    transient: tuple[str, ...] = ()
    """Attributes that bind the source to one model (device tensors, modules, a drafter): a copy or a pickle
    of the source leaves them behind, as None, and the next :meth:`start` binds them again."""

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.update(dict.fromkeys(self.transient))
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def start(self, prompt: np.ndarray, model=None) -> None:
        """A call begins: ``prompt`` int64[L], the target ``model`` (None in a replay without a model)."""

    def limits(self) -> tuple[int, int]:
        """(the most nodes, the deepest path) this source drafts in a step of this call: ``max_nodes`` and
        ``max_depth``, or in the widest steps (:attr:`wide`, ``config.STEP_NODES_LEVELS``) ``wide_nodes`` times the
        nodes and the depth plus ``wide_depth`` of it. Example: 63 nodes 16 deep, wide_nodes 2, wide_depth 0.5:
        126 nodes 24 deep."""
        if not self.wide:
            return self.max_nodes, self.max_depth
        return self.wide_nodes * self.max_nodes, self.max_depth + int(self.wide_depth * self.max_depth)

    def propose(self, context: np.ndarray, max_nodes: int, max_depth: int) -> Proposal | None:
        raise NotImplementedError

    def learn(self, emitted: np.ndarray) -> None:
        """The step emitted ``emitted`` int64[k] (after :meth:`learn_rows` / :meth:`observe_hidden`)."""

    def priced_depth(self, depth: int, cost, margin: float) -> int:
        """(``priced`` sources) How deep to draft this step, at most ``depth``, on the cost curve ``cost``
        (a ``CostModel``, or None when there is no budget); 0 drafts nothing."""
        return depth

    def learn_rows(self, draft, accepted_nodes, top_ids: np.ndarray, top_logits: np.ndarray) -> None:
        """(``wants_rows`` sources) A verified step's rows: the last context token's, then each node of
        ``draft``'s, with their top-k successor ids int64[1 + n, k] and logits float[1 + n, k]."""

    def observe_hidden(self, hidden) -> None:
        """(``wants_hidden`` sources) The final hidden states float[a, H] (a tensor on the model's device) of
        the step's accepted path: the root's row, then each accepted node's; row ``i`` produced the ``i``-th
        emitted token, and the last row is what the next step's draft continues from."""
