"""Tensor parallelism on the CPU: 2 gloo ranks of a tiny Llama loaded with ``tp_plan="auto"``.

One ``torchrun --standalone --nproc-per-node 2 tests/tp_worker.py`` run (module fixture) executes every case
on both ranks; the tests compare the two ranks' results with each other and with this process's own,
unsharded, model (the same weights). Each rank runs the decoder with a clock of its own that disagrees with
the other's (``tp_worker.RankClock``), so the decoder cases pass only because the decode loops take their
clock- and seed-dependent decisions from rank 0 (``lookahead.parallel.RankSync``). The ``RankSync``
functions that need no processes are tested here too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tiny import tiny_model

dist = pytest.importorskip("torch.distributed", reason="torch.distributed is not in this torch build")
if not dist.is_available():
    pytest.skip("torch.distributed is not available in this torch build", allow_module_level=True)
if not dist.is_gloo_available():
    pytest.skip("torch.distributed has no gloo backend in this build: the CPU ranks need it",
                allow_module_level=True)
try:
    from transformers.distributed import DistributedConfig  # noqa: F401
except ImportError:
    pytest.skip("this transformers has no transformers.distributed.DistributedConfig (tensor parallelism)",
                allow_module_level=True)

from lookahead.parallel import (  # noqa: E402
    MAX_FIELDS,
    RankSync,
    checksum,
    encode_message,
    find_divergence,
    model_group,
    shared_values,
)

WORKER = Path(__file__).with_name("tp_worker.py")
RUN_TIMEOUT = 300  # seconds for the whole torchrun (about 15 s); a collective one rank skips fails after 30 s
PROMPT = [1, 5, 9, 11, 5, 9, 11, 5, 9, 11, 4, 7]
BATCH = [[0, 0, 1, 5, 9, 11, 5, 9], [1, 4, 7, 4, 7, 4, 7, 4]]
BATCH_MASK = [[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8]
NEW_TOKENS, SEED = 40, 5
FLAT = ((1, 0.010), (2, 0.010), (256, 0.0102))
CASE_ORDER = ["plain_greedy", "plain_sampled", "plain_batch", "forward_facts", "rank_sync", "decoder_greedy",
              "decoder_window", "decoder_batch", "decoder_sampled", "decoder_sampled_generators_apart"]
"""The worker's cases, in the order it runs them (``tp_worker.CASES``)."""

def _early_eos(rows: list[list[int]], start: int) -> int:
    """A token that ends the first row a few tokens in and never appears in the other row's continuation: then
    the rows of the batch stop at different steps."""
    first, other = rows[0][start:], set(rows[1][start:]) | {0, 2}  # nor the padding or the config's EOS
    for i in range(2, len(first)):
        if first[i] not in other and first[i] not in first[:i]:
            return int(first[i])
    return 2


class TPRun:
    """Both ranks' results of one worker run, and the run's output for the failure messages."""

    def __init__(self, ranks: list[dict], proc: subprocess.CompletedProcess | None, note: str = ""):
        self.ranks, self.proc, self.note = ranks, proc, note

    def tail(self) -> str:
        if self.proc is None:
            return self.note
        text = (self.proc.stdout or "") + (self.proc.stderr or "")
        lines = [line for line in text.splitlines() if "Loading weights" not in line]
        ends = "\n".join(lines[-25:])
        return f"{self.note}torchrun exit status {self.proc.returncode}; its output ends:\n{ends}"

    def case(self, name: str) -> list[dict]:
        """Every rank's result of case ``name``; fails the test, saying why, if a rank lacks it or failed."""
        if len(self.ranks) != 2:
            pytest.fail(f"{len(self.ranks)} of 2 ranks wrote results\n{self.tail()}")
        results = []
        for r in self.ranks:
            res = r["cases"].get(name)
            if res is None:
                done = list(r["cases"])
                order = [c for c in CASE_ORDER if c not in done]
                first = order[0] if order else "?"
                when = "during it" if first == name else f"during case {first}"
                pytest.fail(f"case {name} has no result on rank {r['rank']}: the rank was killed {when} (a "
                            f"broken collective makes gloo abort the process; cases done: {done})\n"
                            f"{self.tail()}")
            if "error" in res:
                pytest.fail(f"case {name} failed on rank {r['rank']}: {res['error']}\n{res.get('where')}")
            results.append(res)
        return results


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tp_model")
    tiny_model("llama").save_pretrained(folder)  # float64: 4 heads, 2 key/value heads, one of each per rank
    return folder


@pytest.fixture(scope="module")
def single(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def refs(single) -> dict:
    """This process's plain generate on the same weights, unsharded."""
    ids = torch.tensor([PROMPT])
    greedy = single.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
    torch.manual_seed(SEED)
    sampled = single.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=True)
    bids, bmask = torch.tensor(BATCH), torch.tensor(BATCH_MASK)
    plain = dict(attention_mask=bmask, max_new_tokens=NEW_TOKENS, do_sample=False)
    eos = _early_eos(single.generate(bids, **plain).tolist(), len(BATCH[0]))
    batch = single.generate(bids, eos_token_id=eos, **plain)
    return {"greedy": greedy[0].tolist(), "sampled": sampled[0].tolist(), "batch": batch.tolist(), "eos": eos}


@pytest.fixture(scope="module")
def tp_run(model_dir, refs, tmp_path_factory) -> TPRun:
    out = tmp_path_factory.mktemp("tp_out")
    spec = {"prompt": PROMPT, "batch": BATCH, "batch_mask": BATCH_MASK, "eos": refs["eos"], "seed": SEED,
            "new_tokens": NEW_TOKENS}
    (out / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", "0", str(WORKER), str(model_dir), str(out), str(out / "spec.json")]
    note = ""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env)
    except subprocess.TimeoutExpired as err:
        proc = None
        note = f"torchrun did not finish within {RUN_TIMEOUT} s (a hang); output: {err.stdout!s:.2000}\n"
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    return TPRun(sorted(ranks, key=lambda r: r["rank"]), proc, note)


# -- plain generate under tensor parallelism: works today --------------------------------------------------


def test_plain_greedy_is_one_processes_on_every_rank(tp_run, refs):
    r0, r1 = tp_run.case("plain_greedy")
    assert r0["tokens"] == r1["tokens"] == refs["greedy"]


def test_plain_sampling_is_one_processes_on_every_rank_for_one_seed(tp_run, refs):
    r0, r1 = tp_run.case("plain_sampled")
    assert r0["tokens"] == r1["tokens"] == refs["sampled"]


def test_plain_batch_is_one_processes_on_every_rank(tp_run, refs):
    r0, r1 = tp_run.case("plain_batch")
    assert r0["tokens"] == r1["tokens"] == refs["batch"]
    assert refs["batch"][0][-1] == 0, "the first row should have stopped early and been padded"


def test_logits_are_gathered_and_identical_on_every_rank(tp_run):
    for r in tp_run.case("forward_facts"):
        assert (r["logits_type"], r["logits_dtype"]) == ("Tensor", "torch.float64")  # not a DTensor
        assert r["logits_shape"] == [1, 12, 96]  # every row, the whole vocabulary
        for step in ("prefill", "one_token", "tree", "after_keep"):  # tree: a 4D mask and explicit positions
            assert r[f"{step}_same_on_ranks"], step
            assert r[f"{step}_diff"] <= 1e-12, step  # float64: the same as the unsharded model's to rounding
        assert r["tree_row_vs_chain_diff"] <= 1e-12


def test_kv_cache_holds_each_ranks_heads_and_rolls_back_in_place(tp_run):
    r0, r1 = tp_run.case("forward_facts")
    for r in (r0, r1):
        assert r["cache_layer"] == "DynamicLayer" and r["keys_type"] == "Tensor"
        # after the prompt (12), one token and a tree of 4: this rank's key/value head of the model's 2
        assert r["keys_shape"] == [1, 1, 17, 8] and r["single_keys_shape"] == [1, 2, 17, 8]
        assert r["cached_after_keep"] == 16  # 13 + the three kept of four
    assert (r0["heads_of_single"], r1["heads_of_single"]) == ([0], [1])


def test_rank_sync_over_the_models_group(tp_run):
    r0, r1 = tp_run.case("rank_sync")
    for r in (r0, r1):
        assert r["active"] and r["size"] == 2 and r["group_size"] == 2 and not r["unsharded_active"]
        assert r["broadcast"] == {"curve": [[1, 0.01]], "rank": 0}  # rank 0's object (tuples: lists in JSON)
        assert r["shared"] == [0.5]
        assert r["diverged_field"]["fields"] == ["cached"] and r["diverged_field"]["ranks"] == [1]
        assert "at step 1, rank 1 differs from rank 0 in: cached" in r["diverged_field"]["message"]
        finish = r["diverged_finish"]["message"]
        assert "rank 1 is at step 3 while rank 0 is at the end of the decode loop" in finish
        assert r["agreed_after"] is None
    assert r0["seeds"] == r1["seeds"]
    torch.manual_seed(SEED)
    assert r0["seeds"] == RankSync().seeds(2), "rank 0's seeds: one process's for the same torch.manual_seed"


# -- the decoder under tensor parallelism: every rank decides as rank 0 -------------------------------------


def _same_on_ranks(tp_run, case: str, expected) -> list[dict]:
    r0, r1 = tp_run.case(case)
    assert r0["tokens"] == r1["tokens"], "the ranks decoded different tokens"
    assert r0["tokens"] == expected
    assert r0["calls"] == r1["calls"]
    return [r0, r1]


def test_decoder_greedy_is_plain_on_every_rank_in_fewer_forwards(tp_run, refs):
    r0, _ = _same_on_ranks(tp_run, "decoder_greedy", [refs["greedy"]])
    assert r0["calls"] < r0["new_tokens"] == NEW_TOKENS
    assert r0["forwards"] == r0["calls"]  # no forward beyond the call's own steps: nothing timed apart


def test_decoder_window_is_plain_on_every_rank(tp_run, refs):
    r0, _ = _same_on_ranks(tp_run, "decoder_window", [refs["greedy"]])
    assert r0["calls"] < r0["new_tokens"]


def test_decoder_batch_is_plain_on_every_rank(tp_run, refs):
    _same_on_ranks(tp_run, "decoder_batch", refs["batch"])


def _decoder_sampled_ref(single) -> list[list[int]]:
    """One process's sampled decoding for ``SEED`` (its tokens do not depend on the drafts or the curve)."""
    from lookahead import LookaheadDecoder

    torch.manual_seed(SEED)
    out = single.generate(torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, do_sample=True,
                          custom_generate=LookaheadDecoder(cost_curve=FLAT))
    return out.tolist()


def test_decoder_sampling_is_one_processes_on_every_rank_for_one_seed(tp_run, single):
    _same_on_ranks(tp_run, "decoder_sampled", _decoder_sampled_ref(single))


def test_decoder_sampling_takes_rank_0s_seed_when_the_generators_drift_apart(tp_run, single):
    _same_on_ranks(tp_run, "decoder_sampled_generators_apart", _decoder_sampled_ref(single))


def test_ranks_that_draft_apart_are_stopped_with_a_clear_error_not_a_hang(tp_run):
    for r in tp_run.case("decoder_ranks_configured_apart"):
        assert r["raised"] == "RankDivergence", r
        assert "rank 1 differs from rank 0 in:" in r["message"]


def test_draft_passes_are_refused_under_tensor_parallelism(tp_run):
    for r in tp_run.case("decoder_draft_passes_refused"):
        assert r["raised"] == "ValueError" and "tensor parallelism" in r["message"], r


# -- RankSync without processes ------------------------------------------------------------------------------


def test_checksum_is_the_same_in_every_process():
    # blake2b of a canonical encoding: no per-process salt, unlike hash(); pinned values
    assert checksum([1, 2]) == checksum((1, 2)) == checksum([np.int64(1), 2])
    assert checksum(torch.tensor([1, 2])) == checksum(np.array([1, 2], dtype=np.int64))
    assert checksum("draft") == checksum("draft")
    code = "from lookahead.parallel import checksum; print(checksum(['draft', (1, 2.5), None]))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) == checksum(["draft", (1, 2.5), None])


def test_checksum_tells_apart_what_a_draft_can_differ_in():
    a = np.array([5, 7, 9], dtype=np.int64)
    variants = [a, a[::-1].copy(), a.astype(np.int32), a.reshape(1, 3), a[:2], [5, 7, 9], 5.0, 5, True, None,
                "5", torch.tensor([5, 7, 9], dtype=torch.bfloat16),
                torch.tensor([5, 7, 9], dtype=torch.float32)]
    assert len({checksum(v) for v in variants}) == len(variants)
    with pytest.raises(TypeError):
        checksum(object())


def test_messages_have_one_size_and_name_what_differs():
    m0 = encode_message(4, 1, {"inputs": [5, 7], "cached": 10}, (0.25,))
    m1 = encode_message(4, 1, {"inputs": [5, 8], "cached": 10}, (0.75,))
    end = encode_message(3, 2, {})
    assert m0.shape == m1.shape == end.shape == encode_message("calibration", 1, {"measuring": True}).shape
    names = ("inputs", "cached")
    assert find_divergence(np.stack([m0, m0]), names) is None
    assert find_divergence(np.stack([m0, m1]), names) == "at step 4, rank 1 differs from rank 0 in: inputs"
    assert shared_values(np.stack([m0, m1]), 1) == (0.25,)
    assert find_divergence(np.stack([m0, end]), names) == (
        "rank 1 is at the end of the decode loop (after step 3) while rank 0 is at step 4")
    later = encode_message(5, 1, {"inputs": [5, 7], "cached": 10})
    assert find_divergence(np.stack([m0, m0, later]), names) == ("rank 2 is at step 5 while rank 0 is at "
                                                                  "step 4")
    with pytest.raises(ValueError):
        encode_message(0, 1, {f"f{i}": i for i in range(MAX_FIELDS + 1)})


def test_rank_sync_is_a_no_op_outside_torch_distributed(single):
    assert not dist.is_initialized()
    sync = RankSync()
    assert not sync.active and (sync.rank, sync.size) == (0, 1)
    assert sync.broadcast({"a": 1}) == {"a": 1}
    assert sync.check(0, inputs=[1, 2], shared=(0.5,)) == (0.5,)
    sync.finish(0)
    torch.manual_seed(3)
    seeds = sync.seeds(2)
    torch.manual_seed(3)
    assert seeds == [int(torch.randint(0, 2**62, (1,)).item()) for _ in range(2)]  # as PositionUniforms draws
    assert sync.collectives == 0
    assert model_group(single) is None and not RankSync.for_model(single).active
    with pytest.raises(ValueError):
        RankSync(every=0)
