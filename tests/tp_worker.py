"""One rank of the tensor-parallel checks in ``test_distributed.py``; run by ``torchrun``, never by pytest.

    torchrun --standalone --nproc-per-node 2 tests/tp_worker.py MODEL_DIR OUT_DIR SPEC_JSON

Each rank initialises a gloo process group (with a short timeout, so that a collective one rank never
joins fails within seconds instead of hanging), loads the model saved in ``MODEL_DIR`` sharded with
``DistributedConfig(tp_plan="auto")`` (what ``tp_plan="auto"`` spells), and runs the cases below in order.
After each case it rewrites ``OUT_DIR/rank{r}.json``: ``{"rank", "world", "cases": {name: result}}``, each
result either what the case measured or ``{"error": "..."}``. A case that breaks a collective makes gloo
abort the process; the cases after it are then missing from both files, which the test reports as not run.

``SPEC_JSON``: ``{"prompt": [...], "batch": [[...], [...]], "batch_mask": [[...], [...]], "eos": int,
"seed": int, "new_tokens": int}``.

The decoder cases give each rank a fake clock (:class:`RankClock`): rank 0's calibration measures a flat
cost curve, the others' a steep one, deterministically. So the ranks disagree by construction, as two
ranks' clocks may under load, and a decoder that does not take rank 0's curve diverges on every run.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

PROCESS_GROUP_TIMEOUT = timedelta(seconds=30)


class RankClock:
    """A fake ``clock`` for ``LookaheadDecoder(_clock=...)``: rank 0's readings are 1 ms apart (every timed
    forward takes the same time: a flat cost curve, on which drafting pays), another rank's ``n``-th reading
    is ``n**3`` ms (each timed forward takes longer than the one before: a steep curve, on which nothing is
    drafted)."""

    def __init__(self, rank: int):
        self.rank, self.n = rank, 0

    def __call__(self) -> float:
        self.n += 1
        return self.n * 1e-3 if self.rank == 0 else self.n ** 3 * 1e-3


def gather_equal(x: torch.Tensor) -> bool:
    """Whether ``x`` is bit for bit the same on every rank."""
    xs = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(xs, x.contiguous())
    return all(torch.equal(xs[0], y) for y in xs)


def tree_mask(past: int, visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive 4D mask [1, 1, q, past + q] of ``q`` new rows that see the whole cache and, among
    themselves, ``visible`` (bool[q, q])."""
    q = visible.shape[0]
    mask = torch.zeros(1, 1, q, past + q, dtype=dtype)
    mask[0, 0, :, past:] = torch.zeros(q, q, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)
    return mask


# -- the cases -----------------------------------------------------------------------------------------------


def plain_greedy(tp, single, spec):
    ids = torch.tensor([spec["prompt"]])
    return {"tokens": tp.generate(ids, max_new_tokens=spec["new_tokens"], do_sample=False)[0].tolist()}


def plain_sampled(tp, single, spec):
    ids = torch.tensor([spec["prompt"]])
    torch.manual_seed(spec["seed"])
    out = tp.generate(ids, max_new_tokens=spec["new_tokens"], do_sample=True)
    return {"tokens": out[0].tolist()}


def plain_batch(tp, single, spec):
    ids, mask = torch.tensor(spec["batch"]), torch.tensor(spec["batch_mask"])
    out = tp.generate(ids, attention_mask=mask, max_new_tokens=spec["new_tokens"], do_sample=False,
                      eos_token_id=spec["eos"])
    return {"tokens": out.tolist()}


def forward_facts(tp, single, spec):
    """What the decoder relies on: gathered logits, identical on every rank and to one process's, for a
    prefill, a one-token step and a tree step with a 4D mask and explicit positions; the KV cache holding this
    rank's heads, rolled back by an in-place gather along the sequence and a crop."""
    from transformers import DynamicCache

    out = {}
    ids = torch.tensor([spec["prompt"]])
    n = ids.shape[1]
    with torch.no_grad():
        c_tp, c_1 = DynamicCache(config=tp.config), DynamicCache(config=single.config)
        a, b = tp(input_ids=ids, cache=c_tp, use_cache=True).logits, single(input_ids=ids, cache=c_1).logits
        out["logits_type"], out["logits_dtype"] = type(a).__name__, str(a.dtype)
        out["logits_shape"] = list(a.shape)
        out["prefill_same_on_ranks"], out["prefill_diff"] = gather_equal(a), float((a - b).abs().max())
        one, pos = torch.tensor([[3]]), torch.tensor([[n]])
        a = tp(input_ids=one, position_ids=pos, cache=c_tp).logits
        b = single(input_ids=one, position_ids=pos, cache=c_1).logits
        out["one_token_same_on_ranks"], out["one_token_diff"] = gather_equal(a), float((a - b).abs().max())
        # a tree after pending token p: nodes x and y follow p, z follows x (rows p x y z)
        past = n + 1
        toks, tpos = torch.tensor([[8, 5, 9, 11]]), torch.tensor([[past, past + 1, past + 1, past + 2]])
        visible = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
        mask = tree_mask(past, visible, tp.dtype)
        a = tp(input_ids=toks, position_ids=tpos, attention_mask=mask, cache=c_tp).logits
        b = single(input_ids=toks, position_ids=tpos, attention_mask=mask, cache=c_1).logits
        out["tree_same_on_ranks"], out["tree_diff"] = gather_equal(a), float((a - b).abs().max())
        chain = DynamicCache(config=single.config)  # row z must be what the chain p x z gives
        single(input_ids=torch.cat([ids, one], 1), cache=chain)
        lin = single(input_ids=torch.tensor([[8, 5, 11]]),
                     position_ids=torch.tensor([[past, past + 1, past + 2]]), cache=chain).logits
        out["tree_row_vs_chain_diff"] = float((a[0, 3] - lin[0, 2]).abs().max())
        keys = c_tp.layers[0].keys
        out["cache_layer"] = type(c_tp.layers[0]).__name__
        out["keys_type"], out["keys_shape"] = type(keys).__name__, list(keys.shape)
        out["single_keys_shape"] = list(c_1.layers[0].keys.shape)
        out["heads_of_single"] = [h for h in range(c_1.layers[0].keys.shape[1])
                                  if torch.allclose(keys[:, 0], c_1.layers[0].keys[:, h], rtol=0, atol=1e-12)]
        keep = torch.tensor([0, 1, 3]) + past  # keep p, x, z: gather them to the front of the step, crop y
        for cache in (c_tp, c_1):
            for layer in cache.layers:
                layer.keys[..., past : past + 3, :] = layer.keys.index_select(-2, keep)
                layer.values[..., past : past + 3, :] = layer.values.index_select(-2, keep)
            cache.crop(-1)
        out["cached_after_keep"] = c_tp.get_seq_length()
        nxt, pos = torch.tensor([[2]]), torch.tensor([[past + 3]])
        a, b = tp(input_ids=nxt, position_ids=pos, cache=c_tp).logits, single(input_ids=nxt, position_ids=pos,
                                                                               cache=c_1).logits
        out["after_keep_same_on_ranks"], out["after_keep_diff"] = gather_equal(a), float((a - b).abs().max())
    return out


def rank_sync(tp, single, spec):
    """``lookahead.parallel.RankSync`` over the model's group: broadcast, seeds, checks, divergences."""
    from lookahead.parallel import RankDivergence, RankSync, model_group

    rank = dist.get_rank()
    sync = RankSync.for_model(tp)
    out = {"active": sync.active, "size": sync.size, "group_size": dist.get_world_size(model_group(tp)),
           "unsharded_active": RankSync.for_model(single).active}
    out["broadcast"] = sync.broadcast({"curve": ((1, 0.01 * (rank + 1)),), "rank": rank})
    torch.manual_seed(spec["seed"])
    if rank:
        torch.rand(1)  # this rank's generator is one draw ahead
    out["seeds"] = sync.seeds(2)
    out["shared"] = list(sync.check(0, ids=[1, 2, 3], cached=7, shared=(0.5 + rank,)))

    def outcome(fn):
        try:
            fn()
        except RankDivergence as err:
            return {"fields": list(err.fields), "ranks": list(err.ranks), "message": str(err)}
        return None

    out["diverged_field"] = outcome(lambda: sync.check(1, ids=[1, 2, 3], cached=7 + rank))
    out["diverged_finish"] = outcome(lambda: sync.finish(2) if rank == 0 else sync.check(3, ids=[1]))
    out["agreed_after"] = outcome(lambda: sync.check("calibration", measuring=True))
    out["collectives"] = sync.collectives
    return out


def _decoder(rank: int, **settings):
    from lookahead import LookaheadDecoder
    from lookahead.cost import Calibrations

    return LookaheadDecoder(_clock=RankClock(rank), _calibrations=Calibrations(), **settings)


def _decoded(dec, out) -> dict:
    return {"tokens": out.tolist(), "calls": dec.stats.target_calls, "new_tokens": dec.stats.new_tokens}


def _one_row(tp, spec, dec, sample: bool):
    forwards = [0]  # every forward of the model during the call, whatever made it
    hook = tp.register_forward_pre_hook(lambda module, args: forwards.__setitem__(0, forwards[0] + 1))
    try:
        out = tp.generate(torch.tensor([spec["prompt"]]), max_new_tokens=spec["new_tokens"], do_sample=sample,
                          custom_generate=dec)
    finally:
        hook.remove()
    return {**_decoded(dec, out), "forwards": forwards[0]}


def decoder_greedy(tp, single, spec):
    return _one_row(tp, spec, _decoder(dist.get_rank()), False)


def decoder_window(tp, single, spec):
    return _one_row(tp, spec, _decoder(dist.get_rank(), window=4), False)


def decoder_batch(tp, single, spec):
    dec = _decoder(dist.get_rank())
    ids, mask = torch.tensor(spec["batch"]), torch.tensor(spec["batch_mask"])
    out = tp.generate(ids, attention_mask=mask, max_new_tokens=spec["new_tokens"], do_sample=False,
                      eos_token_id=spec["eos"], custom_generate=dec)
    return _decoded(dec, out)


def decoder_sampled(tp, single, spec):
    dec = _decoder(dist.get_rank())
    torch.manual_seed(spec["seed"])
    return _one_row(tp, spec, dec, True)


def decoder_sampled_generators_apart(tp, single, spec):
    """One seed, but rank 1's generator one draw ahead (as after any random op of its own)."""
    dec = _decoder(dist.get_rank())
    torch.manual_seed(spec["seed"])
    if dist.get_rank():
        torch.rand(1)
    return _one_row(tp, spec, dec, True)


def _error_of(fn) -> dict:
    try:
        fn()
    except Exception as err:  # what each rank raised, to compare
        return {"raised": type(err).__name__, "message": str(err)[:1000]}
    return {"raised": None}


def decoder_ranks_configured_apart(tp, single, spec):
    """Rank 1's decoder drafts other trees (another config): the first forward that differs is refused on every
    rank with RankDivergence, before its collectives break; the next case still runs."""
    rank = dist.get_rank()
    flat = ((1, 0.01), (2, 0.01), (256, 0.0102))
    from lookahead._tuning import Tuning

    tuning = Tuning(tree_nodes=1, copy_nodes=0, recycle_k=0) if rank else None
    dec = _decoder(rank, cost_curve=flat, _tuning=tuning)
    return _error_of(lambda: _one_row(tp, spec, dec, False))


def decoder_draft_passes_refused(tp, single, spec):
    return _error_of(lambda: _one_row(tp, spec, _decoder(dist.get_rank(), draft="layer-skip"), False))


CASES = [plain_greedy, plain_sampled, plain_batch, forward_facts, rank_sync, decoder_greedy, decoder_window,
         decoder_batch, decoder_sampled, decoder_sampled_generators_apart, decoder_ranks_configured_apart,
         decoder_draft_passes_refused]
"""In order: what must work today first, then the decoder (which may abort the ranks)."""


def main(model_dir: str, out_dir: str, spec_path: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=PROCESS_GROUP_TIMEOUT)
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    rank = dist.get_rank()
    spec = json.load(open(spec_path))
    tp = AutoModelForCausalLM.from_pretrained(model_dir, distributed_config=DistributedConfig(tp_plan="auto"))
    tp.eval()
    single = AutoModelForCausalLM.from_pretrained(model_dir).eval()  # the same weights, whole, in one process
    result = {"rank": rank, "world": dist.get_world_size(), "cases": {}}
    path = os.path.join(out_dir, f"rank{rank}.json")
    for case in CASES:
        try:
            result["cases"][case.__name__] = case(tp, single, spec)
        except Exception as err:  # a Python error keeps both ranks in step; a broken collective aborts them
            tail = traceback.format_exc().strip().splitlines()[-3:]
            result["cases"][case.__name__] = {"error": f"{type(err).__name__}: {err}"[:2000], "where": tail}
        with open(path + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(path + ".tmp", path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
