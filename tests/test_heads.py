"""Trained draft heads (``lookahead.heads``, ``lookahead.heads.train``): tree helpers, training on a tiny model,
files and the model check, exact greedy and sampled decoding with heads as a draft source.

Every model is a tiny random one built from a config (``tiny.py``) except the ``smollm`` test; cost curves and
the heads' own cost are pinned, so no outcome depends on the clock or the machine.
"""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from lookahead import LookaheadDecoder
from lookahead._tuning import Tuning
from lookahead.corpus import fingerprint
from lookahead.cost import CostModel, set_cost_curve
from lookahead.drafting.draft import HEADS
from lookahead.heads import BUNDLED, KINDS, DraftHeads, HeadsSettings
from lookahead.heads.context import ContextCache, ContextLayer, attention_heads, rope, unrolled_features
from lookahead.heads.source import (
    WIDE_DEPTH,
    WIDE_WIDTH,
    best_first_tree,
    bind,
    confidence_bucket,
    context_propose,
    heads_dtypes,
    select_best,
    tree_reach,
)
from lookahead.heads.train import (
    Rows,
    TrainSettings,
    calibrate,
    code_prefix,
    evaluate,
    generate_rows,
    parse_kinds,
    sequence_bounds,
    sequence_ends,
    task_items,
    train_heads,
    vocab_by_frequency,
)

from tiny import TINY_ARCHS, TINY_COST_CURVE, peaky_llama, tiny_model

HEADS_ONLY = dict(_tuning=Tuning(tree_nodes=0, copy_nodes=0, recycle_k=0))  # every other draft source off
FREE = (0.0, 0.0)  # the heads' own cost, pinned


def _rows(model, n: int = 64, prompt_len: int = 8, new: int = 40, seed: int = 0, vocab: int = 96) -> list:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (n, prompt_len), generator=gen)
    return generate_rows(model, ids, torch.ones_like(ids), new, [], 0)


def _trained(model, kind: str, steps: int = 150, seed: int = 0, vocab: int = 96, num_heads: int = 3):
    """(heads, losses, held-out rows) trained on the model's own greedy continuations of random prompts."""
    seqs = _rows(model, seed=seed, vocab=vocab)
    train, held = Rows.of(seqs[:56]), Rows.of(seqs[56:])
    torch.manual_seed(seed)
    heads = DraftHeads.for_model(model, kind, num_heads, vocab_by_frequency(train.tokens, vocab),
                                 settings=HeadsSettings(cost=FREE))
    losses = train_heads(heads, train, model, steps=steps, batch_rows=64, lr=3e-3, seed=seed)
    return heads, losses, held


@pytest.fixture(scope="module")
def llama():
    model = tiny_model("llama")
    set_cost_curve(model, TINY_COST_CURVE)
    return model


@pytest.fixture(scope="module")
def trained(llama):
    """Heads trained and their temperatures calibrated on the held-out rows, as a training run ends: every test
    sees the same heads whichever ran before (calibrating again, as one test does, sets the same temperatures)."""
    out = {kind: _trained(llama, kind) for kind in KINDS}
    for heads, _, held in out.values():
        calibrate(heads, held, llama)
    return out


# ------------------------------------------------------------------------------------------------ helpers


def test_tree_helpers_examples():
    depth, index, parents = best_first_tree(np.array([[0.6, 0.3], [0.6, 0.4]]), 3, 2)
    assert depth.tolist() == [1, 2, 1] and index.tolist() == [0, 0, 1] and parents.tolist() == [-1, 0, -1]
    assert select_best(np.array([-0.1, -0.5, -0.2, -0.9]), np.array([-1, -1, 0, 2]), 2).tolist() == [0, 2]
    assert tree_reach(np.array([5, 6, 7]), np.array([-1, -1, 1]), np.array([6, 7, 9])) == 2
    assert confidence_bucket(np.array([0.1, 0.3, 0.9])).tolist() == [1, 2, 3]
    assert sequence_ends([2, 3]).tolist() == [2, 2, 5, 5, 5]
    starts, lengths = sequence_bounds(Rows(np.zeros((5, 1)), np.zeros(5, np.int64), sequence_ends([2, 3])))
    assert starts.tolist() == [0, 2] and lengths.tolist() == [2, 3]
    assert parse_kinds("context,feature") == ("context", "feature") and parse_kinds("all") == KINDS
    assert parse_kinds("both") == ("medusa", "feature")
    assert attention_heads(576) == 9 and attention_heads(100) == 1 and attention_heads(96) == 1


def test_best_first_tree_is_the_most_probable_paths():
    rng = np.random.default_rng(3)
    probs = -np.sort(-rng.dirichlet(np.ones(5), size=3), axis=1)  # [3 depths, 5 candidates], sorted
    depth, index, parents = best_first_tree(probs, 20, 3)
    scores = []
    for i in range(len(depth)):  # the path's product, walking up
        s, j = 1.0, i
        while j >= 0:
            s *= probs[depth[j] - 1, index[j]]
            j = parents[j]
        scores.append(s)
    every = sorted((np.prod([probs[d, i] for d, i in enumerate(path)])
                    for n in (1, 2, 3) for path in np.ndindex(*([5] * n))), reverse=True)
    assert np.allclose(sorted(scores, reverse=True), every[:20])
    assert all(parents[i] < i for i in range(len(parents)))


def test_settings_refuse_bad_values():
    with pytest.raises(ValueError, match="max_nodes"):
        HeadsSettings(max_nodes=0)
    with pytest.raises(ValueError, match="cost"):
        HeadsSettings(cost=(-1.0, 0.0))
    with pytest.raises(ValueError, match="dtype='float16'"):
        HeadsSettings(dtype="float16")
    with pytest.raises(ValueError, match="kinds"):
        TrainSettings(kinds=("other",))
    with pytest.raises(ValueError, match="kind"):
        DraftHeads("other", 2, 8, [1, 2])


def test_code_prefix_cuts_after_the_docstring():
    answer = "Here:\n```python\ndef double(x):\n    \"\"\"Double x.\"\"\"\n    return 2 * x\n```\n"
    assert code_prefix(answer) == "def double(x):\n    \"\"\"Double x.\"\"\"\n"
    assert code_prefix("no code here") is None


def test_task_items_build_other_requests_on_a_chat_topics_answer():
    """Per chat topic with a direct answer: a summary, a translation of its first two sentences, a reading question
    (one of the topic's own questions), a second turn; then one word problem per topic. Code topics, short answers
    and questions get none; every task keeps its topic's split."""
    items = [{"id": "t0-d", "kind": "chat", "split": "train", "text": "Tell me about owls."},
             {"id": "t0-q0", "kind": "chat", "split": "train", "text": "Why do owls hoot?"},
             {"id": "t1-d", "kind": "code", "split": "train", "text": "Write a sort."},
             {"id": "t2-d", "kind": "chat", "split": "held-out", "text": "Tell me about moss."}]
    answer = "Owls hunt at night. They fly silently! Their eyes are large and face forward, which helps them."
    answers = {"t0-d": answer, "t0-q0": "x" * 100, "t1-d": "y" * 100, "t2-d": "Moss is small."}
    tasks = task_items(items, answers, seed=0)
    assert [t["id"] for t in tasks] == ["t0-summary", "t0-translation", "t0-reading", "t0-turn2", "m0"]
    by_id = {t["id"]: t for t in tasks}
    assert by_id["t0-summary"]["text"] == f"Summarize the text below in a few sentences.\n\n{answer}"
    assert by_id["t0-translation"]["text"].endswith(":\n\nOwls hunt at night. They fly silently!")
    assert by_id["t0-reading"]["text"].endswith(f"Text:\n{answer}\n\nQuestion: Why do owls hoot?")
    assert by_id["t0-turn2"]["text"][:2] == ["Tell me about owls.", answer] and len(by_id["t0-turn2"]["text"]) == 3
    assert all(t["split"] == "train" for t in tasks[:4])
    assert by_id["m0"]["kind"] == "math" and by_id["m0"]["text"].endswith("Explain each step, then state the result.")
    assert task_items(items, answers, seed=0) == tasks  # seeded


# ----------------------------------------------------------------------------------------------- training


@pytest.mark.parametrize("kind", KINDS)
def test_training_lowers_the_loss_and_beats_chance(trained, llama, kind):
    heads, losses, held = trained[kind]
    assert np.mean(losses[-20:]) < 0.9 * np.mean(losses[:20])
    acc = evaluate(heads, held, llama)
    assert min(acc["top1"]) > 10 / 96  # chance is 1 / 96
    temps = calibrate(heads, held, llama)
    assert len(temps) == heads.num_heads and all(t > 0 for t in temps)


@pytest.mark.parametrize("kind", KINDS)
def test_heads_alone_need_fewer_calls_and_stay_identical(trained, llama, kind):
    heads = trained[kind][0]
    prompt = torch.randint(3, 96, (1, 8), generator=torch.Generator().manual_seed(11))
    plain = llama.generate(prompt, max_new_tokens=40, do_sample=False, pad_token_id=0)
    decoder = LookaheadDecoder(heads=heads, **HEADS_ONLY)
    ours = llama.generate(prompt, max_new_tokens=40, custom_generate=decoder, pad_token_id=0)
    assert torch.equal(plain, ours)
    stats = decoder.stats
    assert stats.target_calls < stats.new_tokens
    assert stats.accepted_by_origin["heads"] / stats.drafted_by_origin["heads"] > 5 / 96  # far above chance


@pytest.mark.parametrize("kind", KINDS)
def test_heads_read_the_hidden_rows_whatever_the_linear_layout(trained, llama, kind):
    """A call with heads runs its forwards as the model's decoder, then its output layer
    (``compat.forward_with_hidden``), whatever layout the call's other steps would take: with the transposed layout
    forced, the heads read each step's hidden state, draft as many accepted tokens, and the output stays plain's."""
    heads = trained[kind][0]
    prompt = torch.randint(3, 96, (1, 8), generator=torch.Generator().manual_seed(11))
    plain = llama.generate(prompt, max_new_tokens=40, do_sample=False, pad_token_id=0)
    accepted = {}
    for layout in ("linear", "transposed"):
        decoder = LookaheadDecoder(heads=heads, _tuning=Tuning(tree_nodes=0, copy_nodes=0, recycle_k=0,
                                                               linear_layout=layout))
        ours = llama.generate(prompt, max_new_tokens=40, custom_generate=decoder, pad_token_id=0)
        assert torch.equal(plain, ours), layout
        accepted[layout] = decoder.stats.accepted_by_origin["heads"]
    assert accepted["transposed"] == accepted["linear"] > 0


def test_the_context_head_drafts_what_it_was_trained_to_predict(trained, llama):
    """Drafting (a cache of the answer's positions, then each path's own chain) computes what training's unrolled
    levels compute: the greedy chain it drafts is the argmax of training's levels fed that chain, with the same
    probabilities."""
    heads, _, held = trained["context"]
    bound = bind(heads, llama)
    p, depth = 7, 4
    assert held.ends[0] >= p + 1  # the first held-out answer holds positions 0..p
    hidden = torch.from_numpy(np.asarray(held.hidden[: p + 1], dtype=np.float32))  # [p + 1, H]
    tokens = torch.from_numpy(held.tokens[: p + 1])
    cache = ContextCache()
    for lo, hi in ((0, 3), (3, p + 1)):  # two steps' accepted rows, cached in one flush
        cache.observe(hidden[lo:hi])
        cache.learn(tokens[lo:hi].numpy(), "cpu")
    with torch.no_grad():
        assert cache.flush(heads.context, bound.embed_tokens) and cache.count == p + 1
        drafted, parents, cond = context_propose(bound, cache, max_nodes=depth, max_depth=depth, topk=1, width=1)
        assert parents.tolist() == [-1, 0, 1, 2]
        sequence = torch.cat([tokens, torch.from_numpy(drafted[:-1])])  # level k is fed token p + k - 1
        padded = torch.cat([hidden, torch.zeros(depth - 1, hidden.shape[1])])  # rows past p are never read
        features = unrolled_features(heads.context, padded[None], bound.embed_tokens(sequence)[None],
                                     torch.tensor([[p]]), depth)[0, 0]  # [depth, H]
        temps = torch.tensor([bound.temperature(k) for k in range(1, depth + 1)])[:, None]
        logp = torch.log_softmax(bound.logits(features) / temps, -1)
    assert bound.vocab[logp.argmax(-1).numpy()].tolist() == drafted.tolist()
    assert np.allclose(logp.max(-1).values.exp().numpy(), cond, atol=1e-5)


def test_the_context_cache_keeps_the_last_window_of_positions():
    """Steps of 1-4 accepted rows, 23 positions through a window of 5: the cache holds the last 5 positions' keys
    and values, as one pass over all 23 computes them."""
    torch.manual_seed(0)
    layer = ContextLayer(8, heads=2)
    table = torch.nn.Embedding(30, 8)
    rows, tokens = torch.randn(23, 8), torch.randint(0, 30, (23,))
    cache = ContextCache(window=5)
    at = 0
    with torch.no_grad():
        for n in [1, 4, 2, 3, 1, 4, 4, 2, 2]:
            cache.observe(rows[at: at + n])
            cache.learn(tokens[at: at + n + 1].numpy(), "cpu")  # one more token than rows: the rows decide
            at += n
            assert cache.flush(layer, table) and cache.count == at
            k, v = layer.keys(layer.inputs(rows[:at], table(tokens[:at])), torch.arange(at))
            assert torch.allclose(cache.keys, k[-5:], atol=1e-6) and torch.allclose(cache.values, v[-5:], atol=1e-6)
    assert at == 23


def test_rotary_positions_rotate_pairs_and_keep_norms():
    x = torch.randn(3, 2, 8)  # [positions, heads, dim]
    out = rope(x, torch.tensor([0, 1, 5]))
    assert torch.allclose(out[0], x[0])  # position 0: no rotation
    assert torch.allclose(out.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    q, k = torch.randn(1, 8), torch.randn(1, 8)  # a query and a key: their product depends on the distance only
    near = (rope(q, torch.tensor([3])) * rope(k, torch.tensor([1]))).sum()
    far = (rope(q, torch.tensor([12])) * rope(k, torch.tensor([10]))).sum()
    assert torch.allclose(near, far, atol=1e-5)


def test_a_resumed_training_run_equals_an_uninterrupted_one(llama, tmp_path):
    rows = Rows.of(_rows(llama, n=16))
    vocab = vocab_by_frequency(rows.tokens, 96)

    def fresh():
        torch.manual_seed(0)
        return DraftHeads.for_model(llama, "feature", 2, vocab)

    straight = fresh()
    whole = train_heads(straight, rows, llama, steps=12, batch_rows=16, seed=3)
    resumed = fresh()
    path = str(tmp_path / "ckpt.pt")
    train_heads(resumed, rows, llama, steps=12, batch_rows=16, seed=3, checkpoint=path, checkpoint_every=5, until=7)
    again = fresh()  # a new process: only the checkpoint carries over
    losses = train_heads(again, rows, llama, steps=12, batch_rows=16, seed=3, checkpoint=path, checkpoint_every=5)
    assert np.allclose(losses, whole)
    for a, b in zip(straight.state_dict().values(), again.state_dict().values()):
        assert torch.allclose(a, b)


# ------------------------------------------------------------------------------------------- files, checks


def test_save_load_round_trip(trained, llama, tmp_path):
    for kind in KINDS:
        heads = trained[kind][0]
        heads.save(str(tmp_path / kind))
        again = DraftHeads.load(str(tmp_path / kind), model=llama, cost=FREE)
        header = json.loads((tmp_path / kind / "heads.json").read_text())
        assert header["version"] == (3 if kind == "context" else 1)  # a reader of version 1 or 2 refuses a context head
        assert header["kind"] == kind and header["num_heads"] == heads.num_heads
        assert header["target"] == fingerprint(llama)
        for (name, a), (_, b) in zip(heads.state_dict().items(), again.state_dict().items(), strict=True):
            tol = 1e-3 * float(a.abs().max()) if a.is_floating_point() else 0
            assert torch.allclose(a.float(), b.float(), atol=tol), name  # weights are stored in float16
        prompt = torch.randint(3, 96, (1, 8), generator=torch.Generator().manual_seed(5))
        plain = llama.generate(prompt, max_new_tokens=24, do_sample=False, pad_token_id=0)
        ours = llama.generate(prompt, max_new_tokens=24, custom_generate=LookaheadDecoder(heads=again), pad_token_id=0)
        assert torch.equal(plain, ours)
    (tmp_path / "default.txt").write_text("feature\n")
    assert DraftHeads.load(str(tmp_path)).kind == "feature"  # a training run's folder: its default kind


class _OriginalResBlock(torch.nn.Module):
    """The original Medusa repository's residual block, rebuilt here only to write checkpoints in its format."""

    def __init__(self, hidden: int):
        super().__init__()
        self.linear = torch.nn.Linear(hidden, hidden)
        self.act = torch.nn.SiLU()

    def forward(self, x):
        return x + self.act(self.linear(x))


def _original_medusa(model, folder, num_heads=3, own_outputs=True, layers=1, safetensors=False, seed=0):
    """Write Medusa heads for ``model`` as the original repository saves them (its ``medusa_head`` ModuleList's
    state dict and config.json), with random weights; returns the module."""
    hidden, vocab = model.config.hidden_size, model.config.vocab_size
    torch.manual_seed(seed)
    lm = model.get_output_embeddings().weight.detach().float()
    heads = torch.nn.ModuleList()
    for _ in range(num_heads):
        parts = [_OriginalResBlock(hidden)] * layers
        if own_outputs:
            out = torch.nn.Linear(hidden, vocab, bias=False)
            with torch.no_grad():
                out.weight.copy_(lm + 0.05 * torch.randn(vocab, hidden))  # Medusa starts it from the LM head
            parts.append(out)
        heads.append(torch.nn.Sequential(*parts))
    with torch.no_grad():
        for p in heads.parameters():
            if p.ndim == 2 and p.shape[0] == hidden or p.ndim == 1:
                p.copy_(0.1 * torch.randn(p.shape))
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"medusa_num_heads": num_heads, "medusa_num_layers": layers,
                   "base_model_name_or_path": "tiny-llama"}, f)
    state = {("medusa_head." if safetensors else "") + k: v.contiguous() for k, v in heads.state_dict().items()}
    if safetensors:
        from safetensors.torch import save_file

        save_file(state, os.path.join(folder, "medusa_lm_head.safetensors"))
    else:
        torch.save(state, os.path.join(folder, "medusa_lm_head.pt"))
    return heads


@pytest.mark.parametrize("own_outputs,safetensors", [(True, False), (False, False), (True, True)])
def test_heads_in_the_original_medusa_format_predict_as_there_and_decode_exactly(llama, tmp_path, own_outputs,
                                                                                  safetensors):
    original = _original_medusa(llama, str(tmp_path), own_outputs=own_outputs, safetensors=safetensors)
    heads = DraftHeads.from_medusa(str(tmp_path), llama, cost=FREE)
    assert heads.kind == "medusa" and heads.num_heads == 3 and heads.own_outputs == own_outputs
    assert len(heads.vocab_ids) == llama.config.vocab_size
    lm = llama.get_output_embeddings().weight.detach().float()
    h = torch.randn(5, llama.config.hidden_size, generator=torch.Generator().manual_seed(3))  # [N, H]
    ours = heads.medusa_logits(heads.medusa_hidden(h), lm, None)  # [N, K, V]
    with torch.no_grad():
        theirs = torch.stack([head(h) if own_outputs else head(h) @ lm.T for head in original], 1)
    assert torch.allclose(ours, theirs, atol=1e-5)
    prompt = torch.randint(3, 96, (1, 8), generator=torch.Generator().manual_seed(7))
    plain = llama.generate(prompt, max_new_tokens=32, do_sample=False, pad_token_id=0)
    decoder = LookaheadDecoder(heads=heads, **HEADS_ONLY)
    assert torch.equal(plain, llama.generate(prompt, max_new_tokens=32, custom_generate=decoder, pad_token_id=0))
    assert decoder.stats.drafted_by_origin["heads"] > 0


def test_original_medusa_heads_that_do_not_fit_are_refused(llama, tmp_path):
    _original_medusa(llama, str(tmp_path / "two"), layers=2)
    with pytest.raises(ValueError, match="medusa_num_layers=2"):
        DraftHeads.from_medusa(str(tmp_path / "two"), llama)
    _original_medusa(tiny_model("llama", hidden=48), str(tmp_path / "wide"))
    with pytest.raises(ValueError, match="heads for another model"):
        DraftHeads.from_medusa(str(tmp_path / "wide"), llama)
    with pytest.raises(FileNotFoundError, match="config.json"):
        DraftHeads.from_medusa(str(tmp_path), llama)
    os.remove(tmp_path / "wide" / "medusa_lm_head.pt")
    with pytest.raises(FileNotFoundError, match="medusa_lm_head"):
        DraftHeads.from_medusa(str(tmp_path / "wide"), llama)


def test_heads_with_their_own_outputs_save_as_format_2(llama, tmp_path):
    _original_medusa(llama, str(tmp_path / "orig"))
    heads = DraftHeads.from_medusa(str(tmp_path / "orig"), llama, cost=FREE)
    heads.save(str(tmp_path / "saved"))
    header = json.loads((tmp_path / "saved" / "heads.json").read_text())
    assert header["version"] == 2 and header["own_outputs"] is True
    again = DraftHeads.load(str(tmp_path / "saved"), model=llama)
    assert again.own_outputs and torch.allclose(again.head_out, heads.head_out, atol=1e-2)  # stored in float16
    with pytest.raises(ValueError, match="only Medusa heads"):
        DraftHeads("feature", 2, 32, [3, 4], own_outputs=True)


def test_heads_for_another_model_are_refused_before_any_forward(trained, llama, tmp_path):
    heads = trained["medusa"][0]
    heads.save(str(tmp_path))
    other = tiny_model("llama", seed=99)  # same shapes, other weights
    with pytest.raises(ValueError, match="trained for another model"):
        DraftHeads.load(str(tmp_path), model=other)
    with pytest.raises(ValueError, match="hidden_size"):
        DraftHeads.load(str(tmp_path), model=tiny_model("llama", hidden=48))
    set_cost_curve(other, TINY_COST_CURVE)  # no calibration forwards: only decoding would run the model
    calls = []
    hook = other.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match="trained for another model"):
            other.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=4, pad_token_id=0,
                           custom_generate=LookaheadDecoder(heads=heads))
    finally:
        hook.remove()
    assert not calls


def test_the_same_weights_in_another_precision_are_accepted(trained, llama):
    heads = trained["medusa"][0]
    heads.check_model(copy.deepcopy(llama).to(torch.float32))
    heads.check_model(copy.deepcopy(llama).to(torch.bfloat16))
    changed = copy.deepcopy(llama)
    with torch.no_grad():
        changed.lm_head.weight[3] += 0.5
    with pytest.raises(ValueError):
        heads.check_model(changed)


def test_batches_are_refused_with_a_message(trained, llama):
    with pytest.raises(ValueError, match="batch size 1"):
        llama.generate(torch.tensor([[3, 4, 5], [6, 7, 8]]), max_new_tokens=4, pad_token_id=0,
                       custom_generate=LookaheadDecoder(heads=trained["medusa"][0]))


def test_pricing_drafts_on_a_flat_curve_and_not_where_heads_cost_too_much(trained):
    source = trained["medusa"][0].make_source()
    flat = CostModel([(1, 0.010), (2, 0.010), (256, 0.0102)])
    assert source.priced_depth(3, flat, 1.05) >= 1
    expensive = trained["medusa"][0].with_settings(cost=(0.05, 0.01)).make_source()  # 5x a forward
    steep = CostModel([(1, 0.010), (2, 0.012), (4, 0.022)])
    depths = [expensive.priced_depth(3, steep, 1.05) for _ in range(40)]
    assert depths[:15] == [0] * 15 and max(depths) <= 2  # nothing, then a short probe now and then
    assert source.priced_depth(3, None, 1.05) == 3  # no budget: as deep as asked


def test_the_heads_dtype_choices():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert heads_dtypes("auto", "feature", cpu, True) == (torch.float32, torch.bfloat16)
    assert heads_dtypes("auto", "medusa", cpu, False) == (torch.float32,)  # a given cost: nothing to compare
    assert heads_dtypes("auto", "feature", cuda, True) == (torch.float32,)
    assert heads_dtypes("auto", "context", cpu, True) == (torch.float32,)
    assert heads_dtypes("bfloat16", "context", cpu, True) == (torch.float32,)
    assert heads_dtypes("bfloat16", "medusa", cuda, False) == (torch.bfloat16,)


@pytest.mark.parametrize("kind", ["medusa", "feature"])
def test_heads_computing_in_bf16_draft_as_well_and_stay_exact(trained, llama, kind):
    """The heads in bfloat16 (their copy, the LM-head rows, the embeddings; scores in float32) on a float32 model:
    the output is plain's, and they draft about as well as in float32. (A context head stays float32.)"""
    heads = trained[kind][0]
    prompt = torch.randint(3, 96, (1, 8), generator=torch.Generator().manual_seed(11))
    plain = llama.generate(prompt, max_new_tokens=40, do_sample=False, pad_token_id=0)
    accepted = {}
    for dtype in ("float32", "bfloat16"):
        decoder = LookaheadDecoder(heads=heads.with_settings(dtype=dtype), **HEADS_ONLY)
        ours = llama.generate(prompt, max_new_tokens=40, custom_generate=decoder, pad_token_id=0)
        assert torch.equal(plain, ours), dtype
        source = next(s for s in decoder.policy.sources if s.origin == HEADS)
        assert source.bound.dtype == getattr(torch, dtype) and source.bound.weight.dtype == getattr(torch, dtype)
        assert source.report()["dtype"] == dtype
        accepted[dtype] = decoder.stats.accepted_by_origin["heads"]
    assert accepted["bfloat16"] >= 0.8 * accepted["float32"] > 0
    assert next(iter(heads.parameters())).dtype == torch.float32  # the heads themselves untouched


def test_auto_heads_measure_both_dtypes_on_a_cpu_and_keep_the_cheaper(trained, llama):
    from lookahead.heads.source import _COSTS

    heads = trained["feature"][0].with_settings(cost=None)  # measured
    source = heads.make_source()
    source.start(np.arange(3, 9), llama)
    measured = {key[-1]: cost for key, cost in _COSTS[llama].items() if key[0] == "feature"}
    assert set(measured) == {torch.float32, torch.bfloat16}
    best = min(measured, key=lambda k: measured[k][0] + measured[k][1] * source.limits()[1])
    assert source.bound.dtype == best and source.cost == measured[best]


def test_heads_draft_their_wide_tree_only_in_the_widest_steps():
    """In the widest steps (``DraftSource.wide``, set by the policy) the heads draft twice the nodes, at least
    ``WIDE_DEPTH`` deep and ``WIDE_WIDTH`` paths wide."""
    heads = DraftHeads.bundled()
    source = heads.make_source()
    narrow = (source.limits(), source.paths())
    assert narrow == ((heads.settings.max_nodes, source.max_depth), heads.settings.width)
    source.wide = True
    assert source.limits() == (2 * heads.settings.max_nodes, max(source.max_depth, WIDE_DEPTH))
    assert source.paths() == max(heads.settings.width, WIDE_WIDTH) and len(source.alphas) >= WIDE_DEPTH


# -------------------------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_greedy_identical_with_heads_on_every_tiny_architecture(tiny_models, arch):
    model = tiny_models(arch)
    for kind in KINDS:
        heads = _trained(model, kind, steps=80, seed=1)[0]
        for seed in (0, 1):
            prompt = torch.randint(3, 96, (1, 10), generator=torch.Generator().manual_seed(100 + seed))
            plain = model.generate(prompt, max_new_tokens=32, do_sample=False, pad_token_id=0)
            for overrides in ({}, HEADS_ONLY):
                decoder = LookaheadDecoder(heads=heads, **overrides)
                ours = model.generate(prompt, max_new_tokens=32, custom_generate=decoder, pad_token_id=0)
                assert torch.equal(plain, ours), (arch, kind, seed, overrides)
                assert decoder.stats.new_tokens == 32


VOCAB = 16
PROMPT = [1, 2, 2, 7, 2, 2, 12, 2, 2, 3, 2, 2]


def _second_and_third_token_distribution(model, temperature: float) -> np.ndarray:
    """P(b, c) of the 2nd and 3rd new tokens, float[V, V], by enumeration (summed over the 1st, a)."""
    ids = torch.tensor([PROMPT])
    V = VOCAB
    with torch.no_grad():
        pa = torch.softmax(model(ids).logits[0, -1].float() / temperature, -1)  # [V]
        one = torch.cat([ids.repeat(V, 1), torch.arange(V)[:, None]], 1)  # [V, L + 1]: a
        pb = torch.softmax(model(one).logits[:, -1].float() / temperature, -1)  # [V(a), V(b)]
        two = torch.cat([one.repeat_interleave(V, 0), torch.arange(V).repeat(V)[:, None]], 1)  # [V * V, L + 2]
        pc = torch.softmax(model(two).logits[:, -1].float() / temperature, -1).reshape(V, V, V)  # [a, b, c]
    joint = pa[:, None, None] * pb[:, :, None] * pc
    return joint.sum(0).double().numpy()


def test_sampling_with_heads_is_exact():
    """The heads draft from the second step on (the first has no hidden state yet): the 2nd and 3rd tokens'
    joint distribution is the target's, by a chi-square test at a strict level (seeded: deterministic)."""
    model = peaky_llama(VOCAB)
    heads = _trained(model, "medusa", steps=100, vocab=VOCAB, num_heads=2)[0]
    # the heads' whole tree every step
    decoder = LookaheadDecoder(heads=heads, _tuning=Tuning(adaptive=False, tree_nodes=0, copy_nodes=0, recycle_k=0))
    counts = np.zeros((VOCAB, VOCAB))
    drafted = accepted = 0
    torch.manual_seed(2024)
    ids = torch.tensor([PROMPT])
    for _ in range(1000):
        out = model.generate(ids, custom_generate=decoder, do_sample=True, temperature=0.7, max_new_tokens=3,
                             eos_token_id=None, pad_token_id=0)
        _, b, c = out[0, len(PROMPT):].tolist()
        counts[b, c] += 1
        drafted += decoder.stats.drafted_by_origin["heads"]
        accepted += decoder.stats.accepted_by_origin["heads"]
    assert 0 < accepted < drafted, "both acceptance and rejection of head drafts must happen"
    expected = _second_and_third_token_distribution(model, 0.7).ravel() * counts.sum()
    big = expected >= 5
    obs = np.append(counts.ravel()[big], counts.ravel()[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 1e-9
    p = chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue
    assert p > 1e-4, f"samples with heads do not follow the target distribution (p={p:.2e})"


@pytest.mark.parametrize("compiled", [False, True])
def test_heads_on_a_static_cache_eager_and_compiled(trained, llama, compiled):
    """On a static cache, and where the call would compile its steps (``aot_eager``, ``fullgraph=True``), the heads
    still draft and the tokens are plain static generate's."""
    from transformers import CompileConfig, GenerationConfig

    heads = trained["feature"][0]
    prompt = torch.randint(3, 96, (1, 8), generator=torch.Generator().manual_seed(11))
    kw = dict(max_new_tokens=40, do_sample=False, cache_implementation="static", pad_token_id=0)
    plain = llama.generate(prompt, **kw)
    if compiled:
        config = CompileConfig(backend="aot_eager", fullgraph=True)
        config._compile_all_devices = True  # a CPU: compile as a CUDA user's generate would
        kw = dict(generation_config=GenerationConfig(compile_config=config, **kw))
    decoder = LookaheadDecoder(heads=heads, **HEADS_ONLY)
    assert torch.equal(plain, llama.generate(prompt, custom_generate=decoder, **kw))
    assert decoder.stats.accepted_by_origin["heads"] > 0
    assert decoder.stats.target_calls < decoder.stats.new_tokens


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_heads_on_cuda(trained):
    model = tiny_model("llama").to("cuda")
    set_cost_curve(model, TINY_COST_CURVE)
    heads = trained["feature"][0]
    prompt = torch.randint(3, 96, (1, 8), generator=torch.Generator().manual_seed(11)).to("cuda")
    plain = model.generate(prompt, max_new_tokens=32, do_sample=False, pad_token_id=0)
    decoder = LookaheadDecoder(heads=heads, **HEADS_ONLY)
    assert torch.equal(plain, model.generate(prompt, max_new_tokens=32, custom_generate=decoder, pad_token_id=0))
    assert decoder.stats.accepted_by_origin["heads"] > 0


# -------------------------------------------------------------------------------------------- real model


@pytest.mark.smollm
def test_bundled_heads_on_smollm2_are_exact(smollm):
    model, tok = smollm
    heads = DraftHeads.bundled(cost=FREE)
    heads.check_model(model)
    flat = ((1, 0.010), (2, 0.010), (256, 0.0102))  # the GPU regime: the heads draft every step
    for text in ("Give me three tips for writing clear emails.",
                 "Write a Python function that returns the squares of a list of numbers."):
        inputs = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)
        plain = model.generate(**inputs, max_new_tokens=48, do_sample=False)
        decoder = LookaheadDecoder(heads=heads, cost_curve=flat)
        ours = model.generate(**inputs, max_new_tokens=48, custom_generate=decoder)
        if not torch.equal(plain, ours):  # allowed only at a floating-point near-tie of the top two logits
            first = int((plain[0, : ours.shape[1]] != ours[0, : plain.shape[1]]).nonzero()[0])
            top2 = model(plain[:, :first]).logits[0, -1].topk(2).values
            assert float(top2[0] - top2[1]) < 1e-3, f"{text!r}: outputs differ at token {first} without a near-tie"
        assert decoder.stats.drafted_by_origin["heads"] > 0


def test_the_default_decoder_drafts_with_the_bundled_heads_for_the_bundled_model(smollm):
    """heads="auto" (the default) finds the bundled heads for SmolLM2 on a flat curve and prices them like any
    source; heads=None, a steep (CPU) curve and a batch use none; every output stays plain's."""
    model, tok = smollm
    rows = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
            for t in ("Name three rivers in Europe.", "What makes bread rise?")]
    one = tok(rows[0], return_tensors="pt")
    plain = model.generate(**one, max_new_tokens=32, do_sample=False)
    flat = ((1, 0.010), (2, 0.010), (256, 0.0102))
    auto, none = LookaheadDecoder(cost_curve=flat), LookaheadDecoder(cost_curve=flat, heads=None)
    assert torch.equal(model.generate(**one, max_new_tokens=32, custom_generate=auto), plain)
    assert auto.heads is not None and auto.heads.kind == open(os.path.join(BUNDLED, "default.txt")).read().strip()
    assert auto.stats.drafted_by_origin["heads"] > 0 and auto.corpus is not None  # the bundled corpus beside them
    assert torch.equal(model.generate(**one, max_new_tokens=32, custom_generate=none), plain)
    assert none.heads is None and none.stats.drafted_by_origin["heads"] == 0
    steep = LookaheadDecoder(cost_curve=((1, 0.01), (64, 0.05)))  # a CPU's curve: the heads would not pay
    assert torch.equal(model.generate(**one, max_new_tokens=32, custom_generate=steep), plain)
    assert steep.heads is None
    side, tok.padding_side = tok.padding_side, "left"
    try:
        both = tok(rows, return_tensors="pt", padding=True)
    finally:
        tok.padding_side = side
    plain2 = model.generate(**both, max_new_tokens=16, do_sample=False, pad_token_id=tok.pad_token_id)
    batch = LookaheadDecoder(cost_curve=flat)
    assert torch.equal(model.generate(**both, max_new_tokens=16, pad_token_id=tok.pad_token_id,
                                      custom_generate=batch), plain2)
    assert batch.heads is None


def test_bundled_heads_ship_with_the_package():
    folder = os.path.join(os.path.dirname(os.path.abspath(__import__("lookahead").__file__)), "data",
                          "heads-smollm2")  # the data folder stays at the package's root
    heads = DraftHeads.bundled()
    assert os.path.exists(os.path.join(folder, "default.txt"))
    assert heads.target["architecture"] == "LlamaForCausalLM" and heads.target["vocab_size"] == 49152
    assert heads.trained_on["held_out_accuracy"]["top1"]
