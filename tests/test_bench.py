"""The benchmark runner and its reports, on a tiny random model with token-id prompts (no SmolLM2)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lookahead import LookaheadConfig
from lookahead._tuning import Tuning
from lookahead.config import FLAT_CURVE
from lookahead.tools.bench.methods import DEFAULT_METHODS, METHODS, Method, make_methods
from lookahead.tools.bench.report import markdown, write_reports
from lookahead.tools.bench.runner import run_bench
from lookahead.tools.bench.workloads import WORKLOADS, Prompt, build_workloads

REPETITIVE = [3, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11]
NO_REPEAT = [3, 41, 7, 88, 19, 64, 2, 53, 30, 77, 9]


@pytest.fixture(scope="module")
def greedy_run(tiny_models):
    model = tiny_models("llama")
    return run_bench(model, None, {"code": [REPETITIVE], "chat": [NO_REPEAT]}, ["plain", "lookahead"],
                     max_new_tokens=16, progress=False, model_name="tiny-llama")


def test_records_are_complete_and_consistent(greedy_run, tiny_models):
    records = greedy_run["records"]
    assert {(r["workload"], r["method"]) for r in records} == {
        (w, m) for w in ("code", "chat") for m in ("plain", "lookahead")
    }
    for r in records:
        assert r["status"] == "ok"
        assert 0 < r["new_tokens"] <= 16
        assert r["prompt_tokens"] == len(REPETITIVE if r["workload"] == "code" else NO_REPEAT)
        assert r["wall_s"] > 0 and r["tokens_per_s"] == pytest.approx(r["new_tokens"] / r["wall_s"])
        assert r["tokens_per_call"] == pytest.approx(r["new_tokens"] / r["target_calls"])
        assert r["identical_to_plain"] is True
        assert "mismatch" not in r
        if r["method"] == "plain":
            assert r["target_calls"] == r["new_tokens"]  # one forward per token, counted by the hook
            assert r["speedup_vs_plain"] == 1.0
            assert r["accepted_hist"] is None
        else:
            assert r["target_calls"] == r["reported_target_calls"]  # hook count == decoder's own count
            assert 1 <= r["target_calls"] <= r["new_tokens"]
            assert sum(r["accepted_hist"].values()) == r["target_calls"]  # one histogram entry per step
            assert r["decoder_stats"]["new_tokens"] == r["new_tokens"]
            assert r["speedup_vs_plain"] > 0
    code_la = next(r for r in records if r["workload"] == "code" and r["method"] == "lookahead")
    assert code_la["target_calls"] < code_la["new_tokens"]  # the repetitive prompt drafts well
    assert greedy_run["mismatches"] == [] and greedy_run["unsupported"] == {}


def test_summary_and_context(greedy_run):
    rows = {(r["workload"], r["method"]): r for r in greedy_run["summary"]}
    assert set(rows) == {(w, m) for w in ("code", "chat", "all") for m in ("plain", "lookahead")}
    for (wl, m), row in rows.items():
        recs = [r for r in greedy_run["records"] if r["method"] == m and wl in ("all", r["workload"])]
        assert row["prompts"] == len(recs)
        assert row["new_tokens"] == sum(r["new_tokens"] for r in recs)
        assert row["target_calls"] == sum(r["target_calls"] for r in recs)
        assert row["identical"] == len(recs)
        assert row["speedup_min"] <= row["speedup_q1"] <= row["speedup_median"] <= row["speedup_q3"] \
            <= row["speedup_max"]
    assert rows[("all", "plain")]["speedup_median"] == 1.0
    ctx = greedy_run["context"]
    assert ctx["model"]["name"] == "tiny-llama" and ctx["model"]["dtype"] == "float64"
    assert ctx["model"]["device"] == "cpu" and ctx["model"]["parameters"] > 0
    assert ctx["mode"] == "greedy"
    for key in ("torch", "transformers", "lookahead", "python"):
        assert ctx["versions"][key]
    assert ctx["hardware"]["cpu"] and ctx["hardware"]["torch_threads"] >= 1
    assert greedy_run["settings"]["max_new_tokens"] == 16
    assert greedy_run["settings"]["prompts_per_workload"] == {"code": 1, "chat": 1}
    assert greedy_run["methods"]["lookahead"]["settings"] == {"config": dataclasses.asdict(LookaheadConfig()),
                                                             "tuning": {}}


def test_the_first_call_of_each_method_is_timed_apart(greedy_run):
    """The warm-up: every method once on the first prompt, plain first, timed and counted apart from the records
    (no speed asserted: only the structure and the counts)."""
    firsts = greedy_run["first_calls"]
    assert firsts["order"] == ["plain", "lookahead"] == list(firsts["methods"])
    assert firsts["prompt"] == "code/code-0" and firsts["max_new_tokens"] == 16
    assert "first_calls" in greedy_run["settings"]["warmup"] and len(greedy_run["records"]) == 4  # not a record
    plain, la = firsts["methods"]["plain"], firsts["methods"]["lookahead"]
    for r in (plain, la):
        assert set(r) == {"status", "seconds", "new_tokens", "target_calls", "tokens_per_call", "seconds_vs_plain",
                          "decoded_plain"}
        assert r["status"] == "ok" and r["seconds"] > 0 and 0 < r["new_tokens"] <= 16
        assert r["tokens_per_call"] == pytest.approx(r["new_tokens"] / r["target_calls"])
        assert r["seconds_vs_plain"] == pytest.approx(r["seconds"] / plain["seconds"])
    assert plain["target_calls"] == plain["new_tokens"] and plain["seconds_vs_plain"] == 1.0
    assert plain["decoded_plain"] is None and 1 <= la["target_calls"] <= la["new_tokens"]
    md = markdown(greedy_run)
    assert "The process's first call of each method (not in the medians): at most 16 new tokens on code/code-0, " \
           "one method after the other, in this order: plain, lookahead. Plain runs first" in md
    assert f"| lookahead | {la['seconds']:.3f} | {la['new_tokens']} | {la['target_calls']} | " in md
    assert md.index("first call of each method") < md.index("Per prompt:")


def test_reports_written(greedy_run, tmp_path):
    paths = write_reports(greedy_run, str(tmp_path))
    with open(paths["json"], encoding="utf-8") as f:
        loaded = json.load(f)
    assert loaded["summary"] == json.loads(json.dumps(greedy_run["summary"]))
    assert len(loaded["records"]) == 4
    md = open(paths["markdown"], encoding="utf-8").read()
    assert "| workload | method | prompts | speed-up (median) |" in md
    for wl in ("code", "chat", "all"):
        assert f"| {wl} | lookahead | 1 |" in md or f"| {wl} | lookahead | 2 |" in md
    assert "tiny-llama" in md and "greedy" in md and "max_new_tokens=16" in md
    for r in greedy_run["records"]:  # prompt by prompt, every method beside plain
        if r["method"] == "lookahead":
            assert f"| {r['workload']} | {r['prompt_id']} | {r['new_tokens']} | {r['speedup_vs_plain']:.2f}x " \
                   f"({r['tokens_per_call']:.2f}) |" in md
    with open(paths["plot"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_mismatch_is_reported_with_its_position(tiny_models):
    model = tiny_models("llama")
    # a "method" that changes the output, to check the identity check and its diagnosis
    methods = [Method("plain", "plain"), Method("penalised", "repetition penalty",
                                                 generate_kwargs={"repetition_penalty": 3.0})]
    res = run_bench(model, None, {"code": [REPETITIVE]}, methods, max_new_tokens=12, progress=False,
                    warmup=False)
    rec = next(r for r in res["records"] if r["method"] == "penalised")
    assert rec["identical_to_plain"] is False
    mm = rec["mismatch"]
    assert 0 <= mm["first_difference"] < 12 and mm["top2_gap"] >= 0 and mm["plain_token"] != mm["method_token"]
    assert res["mismatches"][0]["prompt_id"] == "code-0"
    assert "NOT identical" in markdown(res)
    assert res["first_calls"] is None and "first call of each method" not in markdown(res)  # no warm-up


def _refuses_sampling(model, input_ids, logits_processor=None, stopping_criteria=None, generation_config=None,
                      **kwargs):
    """A custom_generate that refuses do_sample=True, as a decoder without sampling support would."""
    if generation_config.do_sample:
        raise ValueError("this decoder does not sample")
    return model.generate(input_ids, generation_config=generation_config, **kwargs)


def test_sampled_run_records_refusals_as_unsupported(tiny_models, tmp_path):
    model = tiny_models("llama")
    methods = make_methods(["lookahead"]) + [Method("refuser", "refuses sampling",
                                                    generate_kwargs={"custom_generate": _refuses_sampling})]
    res = run_bench(model, None, {"code": [REPETITIVE, NO_REPEAT]}, methods, max_new_tokens=8, sample=True,
                    progress=False)
    assert res["context"]["mode"] == "sampled" and res["settings"]["sampling"] == {"temperature": 0.7, "top_p": 0.9}
    assert res["unsupported"] == {"refuser": "ValueError: this decoder does not sample"}
    assert res["first_calls"]["methods"]["refuser"] == {"status": "unsupported",
                                                       "reason": "ValueError: this decoder does not sample"}
    by_method = {}
    for r in res["records"]:
        by_method.setdefault(r["method"], []).append(r)
    assert [r["status"] for r in by_method["refuser"]] == ["unsupported", "unsupported"]
    for r in by_method["plain"] + by_method["lookahead"]:
        assert r["status"] == "ok" and r["identical_to_plain"] is None and r["new_tokens"] > 0
    rows = {(r["workload"], r["method"]): r for r in res["summary"]}
    assert rows[("code", "refuser")]["status"] == "unsupported"
    md = markdown(res)
    assert "| code | refuser | 0 | unsupported |" in md and "this decoder does not sample" in md
    write_reports(res, str(tmp_path))


def test_greedy_refusal_is_an_error_not_unsupported(tiny_models):
    model = tiny_models("llama")

    def refuses_all(model, input_ids, **kwargs):
        raise ValueError("refused")

    methods = [Method("plain", "plain"), Method("refuser", "r", generate_kwargs={"custom_generate": refuses_all})]
    with pytest.raises(ValueError, match="refused"):
        run_bench(model, None, {"code": [REPETITIVE]}, methods, max_new_tokens=4, progress=False, warmup=False)


def _counting_lookahead() -> tuple[list, list]:
    """(methods plain + lookahead, the list of every decoder the lookahead factory makes)."""
    made = []

    def counting():
        m = METHODS["lookahead"]()
        made.append(m.decoder)
        return m

    return make_methods(["lookahead"], registry={"plain": METHODS["plain"], "lookahead": counting}), made


@pytest.mark.parametrize("fresh", [True, False])
def test_fresh_decoder_per_prompt_or_one_for_the_run(tiny_models, fresh):
    model = tiny_models("llama")
    methods, made = _counting_lookahead()
    res = run_bench(model, None, {"code": [REPETITIVE, NO_REPEAT]}, methods, max_new_tokens=6, progress=False,
                    fresh_per_prompt=fresh)
    assert len(made) == (1 + 1 + 2 if fresh else 1)  # make_methods, warm-up, one per prompt
    assert len({id(d) for d in made}) == len(made)
    assert ("fresh instance" if fresh else "one instance") in res["settings"]["state"]
    assert all(r["identical_to_plain"] for r in res["records"])


def test_repeats_time_each_prompt_by_the_median_of_its_runs(tiny_models):
    model = tiny_models("llama")
    methods, made = _counting_lookahead()
    res = run_bench(model, None, {"code": [REPETITIVE, NO_REPEAT]}, methods, max_new_tokens=6, progress=False,
                    repeats=3)
    assert len(made) == 1 + 1 + 2 * 3  # make_methods, warm-up, a fresh one per prompt and round
    assert len(res["records"]) == 4  # one record per prompt and method, not per round
    for r in res["records"]:
        assert len(r["wall_s_runs"]) == 3
        assert r["wall_s"] == sorted(r["wall_s_runs"])[1]
        assert r["tokens_per_s"] == pytest.approx(r["new_tokens"] / r["wall_s"])
        assert r["identical_to_plain"] is True and "repeats_identical" not in r
    assert res["settings"]["repeats"] == 3 and "median" in res["settings"]["timing"]
    assert "median wall time of 3 runs" in markdown(res)
    with pytest.raises(ValueError, match="repeats"):
        run_bench(model, None, {"code": [REPETITIVE]}, ["plain"], max_new_tokens=4, progress=False, repeats=0)


def test_prompt_forms_and_method_registry():
    assert Prompt("a", ids=(1, 2)).ids == (1, 2)
    with pytest.raises(ValueError):
        Prompt("a")
    assert set(METHODS) >= {"plain", "prompt-lookup", "lookahead", "lookahead-small", "lookahead-window"}
    assert set(DEFAULT_METHODS) <= set(METHODS)
    assert METHODS["lookahead"]().description == "LookaheadDecoder()"
    methods = make_methods(["lookahead-small", "prompt-lookup"])
    assert [m.name for m in methods] == ["plain", "lookahead-small", "prompt-lookup"]  # baseline first
    assert methods[2].kwargs() == {"prompt_lookup_num_tokens": 10}
    assert methods[1].settings["tuning"]["tree_nodes"] < Tuning().tree_nodes  # the non-default tuning fields
    assert methods[1].description.startswith("LookaheadDecoder(_tuning=Tuning(tree_nodes=6, ")
    with pytest.raises(ValueError, match="valid: plain, plain-again, prompt-lookup"):
        make_methods(["nope"])


def heads_or_skip():
    """``lookahead.heads`` (the optional heads subpackage), or a skip while it is not in place."""
    try:
        import lookahead.heads.train  # noqa: F401
    except ImportError as err:
        pytest.skip(f"lookahead.heads is not importable ({err})")


def test_every_method_is_made_with_the_new_api():
    """Each registered method builds its decoder and records the decoder's config and non-default tuning (the
    ones with the bundled heads: see the corpus test below)."""
    for name, factory in METHODS.items():
        if "heads" in name:
            continue
        m = factory()
        assert m.name == name and m.description and json.loads(json.dumps(m.settings)) is not None, name
        if m.decoder is not None:
            assert m.settings["config"] == dataclasses.asdict(m.decoder.config), name
    settings = {name: METHODS[name]().settings for name in ("lookahead-fixed", "lookahead-flat", "no-drafts",
                                                            "lookahead-linear", "lookahead-transposed",
                                                            "lookahead-no-fill", "lookahead-window")}
    assert settings["lookahead-fixed"]["tuning"] == {"adaptive": False}
    assert settings["lookahead-flat"] == {"config": {"max_draft_tokens": "auto", "window": "auto",
                                                     "cost_curve": FLAT_CURVE}, "tuning": {}}
    assert settings["no-drafts"]["config"]["max_draft_tokens"] == 0
    assert settings["lookahead-linear"]["tuning"] == {"linear_layout": "linear"}
    assert settings["lookahead-transposed"]["tuning"] == {"linear_layout": "transposed"}
    assert settings["lookahead-no-fill"]["tuning"] == {"fill_nodes": 0}
    assert settings["lookahead-window"]["config"]["window"] == 4
    assert "lookahead-interpolated" not in METHODS
    draft = METHODS["self-early-exit"]()
    assert draft.settings["draft"] == "early-exit" and draft.settings["corpus"] is None
    assert draft.settings["tuning"] == {"tree_nodes": 0, "copy_nodes": 0, "recycle_k": 0, "fill_nodes": 0}
    assert METHODS["draft-model"]().settings["draft"] == "the target's first 10 layers"


@pytest.mark.parametrize("name", ["lookahead-flat", "lookahead-fixed", "no-drafts", "lookahead-small"])
def test_tuned_methods_give_plain_greedy_output(tiny_models, name):
    res = run_bench(tiny_models("llama"), None, {"code": [REPETITIVE]}, ["plain", name], max_new_tokens=10,
                    progress=False, warmup=False)
    assert all(r["identical_to_plain"] for r in res["records"]), res["mismatches"]
    rec = next(r for r in res["records"] if r["method"] == name)
    if name == "no-drafts":
        assert rec["target_calls"] == rec["new_tokens"]  # every step plain


def test_the_corpus_methods_decode_with_the_corpus_they_name():
    """``lookahead`` finds the corpus kept for the model (``corpus="auto"``); ``lookahead-no-corpus`` has none,
    ``lookahead+corpus`` the bundled one, ``lookahead+heads+corpus`` the bundled heads and corpus together."""
    from lookahead.corpus import DraftCorpus

    heads_or_skip()
    default, none, given, both = (METHODS[name]().decoder for name in (
        "lookahead", "lookahead-no-corpus", "lookahead+corpus", "lookahead+heads+corpus"))
    assert default.corpus_setting == "auto" and none.corpus_setting is None and none.corpus is None
    assert given.corpus is DraftCorpus.bundled() and both.corpus is DraftCorpus.bundled()
    assert both.heads is not None and both.corpus_setting is both.corpus


def test_workloads_come_from_local_material():
    w = build_workloads(list(WORKLOADS), 3)
    assert list(w) == ["code-completion", "code-editing", "chat", "rewrite", "qa", "translation", "summarization",
                       "math", "rag", "multi-turn"]
    for name, prompts in w.items():
        assert len(prompts) == 3, name
        assert len({p.id for p in prompts}) == 3 and all(p.text for p in prompts)
    assert w["code-completion"][0].id == "HumanEval/0" and not w["code-completion"][0].chat
    assert "def " in w["code-editing"][0].text and "```python" in w["code-editing"][0].text
    assert len(build_workloads(["code-completion"], 500)["code-completion"]) == 164
    families = build_workloads(["qa", "translation", "summarization", "math", "rag", "multi-turn"], 500)
    assert {name: len(prompts) for name, prompts in families.items()} == dict.fromkeys(families, 8)
    assert "Translate the following French text into English." in families["translation"][4].text
    rag = families["rag"][3].text
    assert "Document 2:" in rag and rag.endswith("Question: How often will the buses on route 11 run in the "
                                                 "evening after the change?")
    for chat in families["multi-turn"]:  # whole chats: earlier turns, then a user turn asking about them
        assert isinstance(chat.text, tuple) and len(chat.text) >= 3 and chat.text[-1][0] == "user"
    with pytest.raises(ValueError, match="valid: code-completion, code-editing, chat, rewrite, qa"):
        build_workloads(["poetry"], 1)


def test_a_whole_chat_goes_through_the_chat_template():
    import torch

    from lookahead.tools.bench.runner import encode
    from lookahead.tools.bench.workloads import texts

    class Tokenizer:
        chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"

        def apply_chat_template(self, messages, **kwargs):
            self.seen = messages
            return {"input_ids": torch.tensor([[1, 2]])}

    tok = Tokenizer()
    assert encode(Prompt("c", tuple(texts()["chats"][0])), tok, None)["input_ids"].tolist() == [[1, 2]]
    assert [m["role"] for m in tok.seen] == ["user", "assistant", "user", "assistant", "user"]


def test_plain_again_is_an_a_a_control(tiny_models):
    """``plain-again`` runs exactly what ``plain`` runs: identical output, one call per token."""
    again = make_methods(["plain-again"])[1]
    assert again.name == "plain-again" and again.kwargs() == {} and again.decoder is None
    run = run_bench(tiny_models("llama"), None, {"code": [REPETITIVE]}, ["plain", "plain-again"],
                    max_new_tokens=8, progress=False, model_name="tiny-llama")
    rec = next(r for r in run["records"] if r["method"] == "plain-again")
    plain_rec = next(r for r in run["records"] if r["method"] == "plain")
    assert rec["identical_to_plain"] is True and rec["target_calls"] == plain_rec["target_calls"]
