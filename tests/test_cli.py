"""``python -m lookahead``: argument errors, and generate/bench end to end on a tiny saved model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import weakref

import pytest
import torch

from lookahead.__main__ import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A tiny random llama and a one-character-per-token tokenizer, saved like a real model folder."""
    import transformers as tf
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<eos>": 0, **{chr(c): c - 31 for c in range(32, 127)}}  # 96 tokens
    t = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    t.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    t.decoder = decoders.Fuse()
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=t, eos_token="<eos>", pad_token="<eos>")
    cfg = tf.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(7)
    model = tf.LlamaForCausalLM(cfg).eval()
    folder = tmp_path_factory.mktemp("tiny-model")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder), model, tok


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "--max-new-tokens", "-5"], "--max-new-tokens: must be a positive integer, got -5"),
        (["bench", "--max-new-tokens", "ten"], "--max-new-tokens: must be a positive integer, got 'ten'"),
        (["bench", "--prompts-per-workload", "0"], "--prompts-per-workload: must be a positive integer"),
        (["bench", "--methods", "plain,warp-drive"],
         "unknown method 'warp-drive'; valid: plain, plain-again, prompt-lookup, lookahead, lookahead-small, "
         "lookahead-window"),
        (["bench", "--workloads", "poetry,chat,jokes"],
         "unknown workloads 'poetry', 'jokes'; valid: code-completion, code-editing, chat, rewrite, qa, "
         "translation, summarization, math, rag, multi-turn"),
        (["bench", "--methods", ","], "no method given; valid: plain"),
        (["bench", "--dtype", "int3"], "invalid choice: 'int3'"),
        (["generate"], "the following arguments are required: --prompt"),
        (["generate", "--prompt", "hi", "--max-new-tokens", "0"], "must be a positive integer, got 0"),
        (["demo", "--max-new-tokens", "-1"], "must be a positive integer, got -1"),
        (["demo", "--threads", "0"], "--threads: must be a positive integer, got 0"),
        (["demo", "--dtype", "int3"], "invalid choice: 'int3'"),
        (["generate", "--prompt", "hi", "--threads", "many"],
         "--threads: must be a positive integer, got 'many'"),
        (["warmup", "--calibrate", "int8"], "unknown dtype 'int8'; valid: float32, bfloat16, float16"),
        (["fly"], "invalid choice: 'fly'"),
        ([], "the following arguments are required: command"),
    ],
)
def test_argument_errors_exit_2_with_a_clear_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_generate_rejects_unknown_config_field_before_loading(capsys):
    assert main(["generate", "--prompt", "hi", "--config", "tree_nodes=3", "--model", "/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert "unknown LookaheadConfig field 'tree_nodes'; valid: max_draft_tokens, window, cost_curve" in err
    assert main(["generate", "--prompt", "hi", "--config", "max_draft_tokens=-1", "--model", "/nonexistent"]) == 2
    assert "LookaheadConfig.max_draft_tokens=-1 is invalid" in capsys.readouterr().err
    assert main(["generate", "--prompt", "hi", "--config", "cost_curve=steep", "--model", "/nonexistent"]) == 2
    assert "LookaheadConfig.cost_curve='steep' is invalid" in capsys.readouterr().err


def test_module_entry_point_exit_status():
    proc = subprocess.run([sys.executable, "-m", "lookahead", "bench", "--methods", "nope"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "unknown method 'nope'; valid:" in proc.stderr


def test_generate_streams_the_plain_greedy_text(tiny_folder, capsys):
    folder, model, tok = tiny_folder
    prompt = "abcabcabcabcabc"
    assert main(["generate", "--model", folder, "--prompt", prompt, "--raw", "--max-new-tokens", "12",
                 "--config", "max_draft_tokens=6", "--config", "cost_curve=flat"]) == 0
    captured = capsys.readouterr()
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    plain = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    expected = tok.decode(plain[0, ids.shape[1]:], skip_special_tokens=True)
    assert captured.out == expected + "\n"
    assert "target calls" in captured.err and "max_draft_tokens=6" in captured.err
    assert "streamed nothing" not in captured.err  # it really streamed, token by token


def test_generate_plots_the_budget(tiny_folder, tmp_path, capsys):
    folder, _, _ = tiny_folder
    png = tmp_path / "budget.png"
    assert main(["generate", "--model", folder, "--prompt", "abcabcabcabc", "--raw", "--max-new-tokens", "10",
                 "--plot-budget", str(png)]) == 0
    assert f"budget plot: {png}" in capsys.readouterr().err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_generate_samples(tiny_folder, capsys):
    folder, _, _ = tiny_folder
    assert main(["generate", "--model", folder, "--prompt", "abcabc", "--raw", "--max-new-tokens", "5",
                 "--sample", "--temperature", "0.9"]) == 0
    assert "target calls" in capsys.readouterr().err


def test_bench_command_end_to_end(tiny_folder, tmp_path, capsys):
    folder, _, _ = tiny_folder
    out = tmp_path / "bench"
    rc = main(["bench", "--model", folder, "--workloads", "chat,rewrite", "--methods", "lookahead",
               "--prompts-per-workload", "1", "--max-new-tokens", "6", "--out", str(out), "--no-progress"])
    assert rc == 0
    assert sorted(os.listdir(out)) == ["bench.json", "bench.md", "bench.png"]
    result = json.loads((out / "bench.json").read_text())
    assert result["settings"]["max_new_tokens"] == 6
    assert result["context"]["command"].startswith("python -m lookahead bench --model ")
    assert result["workloads"] == {"chat": ["chat-0"], "rewrite": ["passage-0"]}
    assert {r["method"] for r in result["records"]} == {"plain", "lookahead"}
    assert all(r["identical_to_plain"] for r in result["records"])
    assert "| chat | lookahead | 1 |" in capsys.readouterr().out


def _subparsers():
    import argparse

    from lookahead.tools.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return parser, sub.choices


def test_help_is_plain_text():
    """The top-level description is the module docstring: no reST double backticks in any --help."""
    parser, commands = _subparsers()
    for p in (parser, *commands.values()):
        assert "``" not in p.format_help(), p.prog
    assert "demo      plain generate vs LookaheadDecoder" in parser.format_help()
    assert "warmup    compile the Numba kernels" in parser.format_help()


@pytest.mark.parametrize("command", ["demo", "generate", "bench", "warmup", "train-heads", "build-corpus"])
def test_every_option_has_a_help_text_with_its_default(command):
    parser = _subparsers()[1][command]
    options = [a for a in parser._actions if a.option_strings and a.dest != "help" and not a.required]
    assert options
    for action in options:
        assert action.help, action.option_strings
        text = action.help % {**vars(action), "prog": parser.prog}  # what --help prints
        assert "(default: " in text or "; default: " in text, (action.option_strings, text)
        if action.default not in (None, False):
            assert f"default: {action.default}" in text, (action.option_strings, text)
    shown = " ".join(parser.format_help().split())
    if command == "generate":
        for line in ("--max-new-tokens MAX_NEW_TOKENS the most new tokens to generate (default: 128)",
                     "(default: 0.7)", "(default: 0.9)"):
            assert line in shown


def test_generate_accounts_for_load_set_up_and_calibration_time(tiny_folder, capsys):
    """Model load, decoder set-up (Numba kernels) and calibration each get their own stderr line, and so
    does generate's time outside the decoder's phases (values are not checked: they depend on the machine)."""
    import re

    folder, _, _ = tiny_folder
    argv = ["generate", "--model", folder, "--prompt", "abcabcabc", "--raw", "--max-new-tokens", "5"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    seconds = r"-?\d+\.\d\d s"
    for line in (rf"\[model loaded in {seconds}\]", rf"\[decoder set-up in {seconds} \(Numba kernels",
                 rf"\[cost-curve calibration {seconds} \(", rf"\[\d+ new tokens in {seconds}: ",
                 rf"\[generate outside the decoder's phases and calibration: {seconds}\]"):
        assert len(re.findall(rf"(?m)^{line}", err)) == 1, (line, err)


@pytest.mark.parametrize(
    "model_arg, prompt, name, which",
    [
        (None, None, "SmolLM2-135M-Instruct", "code-editing prompt"),
        ("smollm2", None, "SmolLM2-135M-Instruct", "code-editing prompt"),
        ("some/llama", "abcabcabc", "some/llama", "your prompt"),
    ],
)
def test_demo_names_the_model_and_the_prompt_it_ran(tiny_folder, monkeypatch, capsys, model_arg, prompt, name,
                                                    which):
    """The demo printed "SmolLM2-135M-Instruct" and "code-editing prompt" whatever --model and --prompt
    said. The tiny model stands in for whatever load_model would load (it is not loaded by name here)."""
    import copy
    import re

    from lookahead.tools import models

    _, model, tok = tiny_folder
    tok = copy.deepcopy(tok)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    asked = []
    monkeypatch.setattr(models, "load_model", lambda name=None, **kw: asked.append(name) or (model, tok))
    argv = ["demo", "--max-new-tokens", "6", "--threads", str(torch.get_num_threads())]
    argv += ["--model", model_arg] if model_arg else []
    argv += ["--prompt", prompt] if prompt else []
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert asked == [model_arg]
    header = rf"model: {re.escape(name)} \(torch.float32, cpu\), greedy, \d+ new tokens, {which}"
    assert len(re.findall(rf"(?m)^{header}$", out)) == 1 and out.count("model: ") == 1, out


def test_demo_takes_the_device_dtype_and_threads_it_is_given(tiny_folder, monkeypatch, capsys):
    import copy

    from lookahead.tools import models

    _, model, tok = tiny_folder
    tok = copy.deepcopy(tok)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    seen = []
    monkeypatch.setattr(models, "load_model", lambda name=None, **kw: seen.append(kw) or (model, tok))
    before = torch.get_num_threads()
    try:
        assert main(["demo", "--max-new-tokens", "4", "--prompt", "abcabc", "--dtype", "bfloat16", "--device",
                     "cpu", "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert seen[0]["dtype"] is torch.bfloat16 and seen[0]["device"] == "cpu"
    out = capsys.readouterr()
    assert "tokens in" in out.out.splitlines()[-2]  # what the decoder did and why, then the first calls apart
    assert out.out.splitlines()[-1].startswith("first call of the process (8 tokens, not in the figures above): "
                                               "plain generate ")
    for line in ("first calls: 8 tokens plain and 8 with the decoder, reported apart ...",
                 "plain generate, up to 4 new tokens ...", "LookaheadDecoder, up to 4 new tokens ..."):
        assert line in out.err  # each phase announced on stderr, then timed
    assert "plain generate, up to 4 new tokens: " in out.err


def test_the_library_says_what_it_is_doing_on_stderr(tiny_folder, capsys):
    """generate's stderr carries the library's own lines: the load, and the cost curve (learnt from the call's
    steps, or read back from the session's cache folder when an earlier test measured this model already)."""
    folder, _, _ = tiny_folder
    assert main(["generate", "--model", folder, "--prompt", "abcabc", "--raw", "--max-new-tokens", "4",
                 "--threads", "1"]) == 0
    err = capsys.readouterr().err
    assert f"loading {folder} ..." in err and f"loaded {folder} in " in err
    assert ("calibrates the curve from their own steps" in err or "learn the curve from their own steps" in err
            or "using the cost curve learnt for this model on " in err
            or "using the cost curve measured for this model on " in err), err


@pytest.fixture(scope="module")
def chat_folder(tiny_folder, tmp_path_factory):
    """The tiny model's folder with a chat template, as a chat model's folder has."""
    import copy
    import shutil

    folder, model, tok = tiny_folder
    chat = tmp_path_factory.mktemp("tiny-chat-model")
    shutil.copytree(folder, chat, dirs_exist_ok=True)
    tok = copy.deepcopy(tok)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tok.save_pretrained(chat)
    return str(chat), model, tok


def test_train_heads_command_trains_saves_and_the_demo_drafts_with_them(chat_folder, tmp_path, monkeypatch,
                                                                        capsys):
    """``python -m lookahead train-heads`` end to end on a prompts file (answers, vocabulary, training, the
    held-out report), then ``demo --heads DIR`` decodes with the heads it wrote, identically to plain."""
    import json

    from lookahead.heads import DraftHeads
    from lookahead.tools import models

    folder, model, tok = chat_folder
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"abc{i} abc{i} def{i % 3} abc" for i in range(30)) + "\n")
    out = tmp_path / "heads"
    argv = ["train-heads", "--out", str(out), "--model", folder, "--prompts", str(prompts), "--kind", "both",
            "--heads", "2", "--vocab", "64", "--max-new-tokens", "24", "--raw-tokens", "0", "--batch-size", "8",
            "--steps", "20", "--batch-rows", "32", "--dtype", "float32", "--device", "cpu", "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "medusa: held-out top-1" in printed and "feature: held-out top-1" in printed
    default = (out / "default.txt").read_text().strip()
    assert default in ("medusa", "feature")
    header = json.loads((out / default / "heads.json").read_text())
    assert header["target"]["vocab_size"] == 96 and header["num_heads"] == 2
    heads = DraftHeads.load(str(out), model=model)
    assert heads.kind == default
    assert (out / "corpus" / "corpus.json").exists()  # the answers it trained on, as a draft corpus too

    monkeypatch.setattr(models, "load_model", lambda name=None, **kw: (model, tok))
    assert main(["demo", "--max-new-tokens", "12", "--prompt", "abc1 abc1 def1 abc", "--heads", str(out),
                 "--threads", str(torch.get_num_threads())]) == 0
    shown = capsys.readouterr().out
    assert "lookahead+heads" in shown and "identical (heads)  : yes" in shown


def test_build_corpus_command_writes_the_training_answers_and_the_demo_drafts_from_them(chat_folder, tmp_path,
                                                                                        monkeypatch, capsys):
    """``python -m lookahead build-corpus`` on a prompts file: the training split's greedy answers (every tenth
    prompt held out), bound to the model and installed in the user cache, where the default decoder finds it;
    ``demo --corpus DIR`` decodes with them, identically to plain."""
    from lookahead import corpus as corpus_module
    from lookahead import kept
    from lookahead.corpus import DraftCorpus, corpus_for
    from lookahead.tools import models

    folder, model, tok = chat_folder
    monkeypatch.setenv("LOOKAHEAD_CACHE", str(tmp_path / "cache"))  # the install goes into this test's own cache
    monkeypatch.setattr(kept, "_FOUND", weakref.WeakKeyDictionary())  # what is found here stays here
    monkeypatch.setattr(corpus_module, "_LOADED", {})
    lines = [f"abc{i} abc{i} def{i % 3} abc" for i in range(20)]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(lines) + "\n")
    out = tmp_path / "written"
    argv = ["build-corpus", "--out", str(out), "--model", folder, "--prompts", str(prompts), "--max-new-tokens", "16",
            "--batch-size", "8", "--dtype", "float32", "--device", "cpu", "--no-progress"]
    assert main(argv) == 0
    assert not (out / "default.txt").exists()  # no heads trained
    corpus = DraftCorpus.load(str(out / "corpus"), model=model)
    assert corpus.streams == 18 and 0 < corpus.lengths.max() <= 16  # prompts 9 and 19 are held out
    assert (out / "work" / "prompts.json").exists()  # a rerun resumes from here
    assert corpus.described["split"].startswith("train")
    found = corpus_for(model)  # installed: LookaheadDecoder() drafts from it with no argument
    assert found is not None and found.tokens.tolist() == corpus.tokens.tolist()
    assert "installed it in" in capsys.readouterr().err

    monkeypatch.setattr(models, "load_model", lambda name=None, **kw: (model, tok))
    capsys.readouterr()
    assert main(["demo", "--max-new-tokens", "12", "--prompt", lines[1], "--corpus", str(out / "corpus"),
                 "--threads", str(torch.get_num_threads())]) == 0
    shown = capsys.readouterr().out
    assert "lookahead+corpus" in shown and "identical (corpus) : yes" in shown


def test_demo_refuses_heads_trained_for_another_model(tiny_folder, monkeypatch):
    import copy

    from lookahead.tools import models

    _, model, tok = tiny_folder
    tok = copy.deepcopy(tok)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    monkeypatch.setattr(models, "load_model", lambda name=None, **kw: (model, tok))
    with pytest.raises(ValueError, match="trained for another model"):
        main(["demo", "--max-new-tokens", "4", "--prompt", "abcabc", "--heads"])  # the bundled SmolLM2 heads
