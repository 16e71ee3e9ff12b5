"""``python -m lookahead``: argument errors, and generate/bench end to end on a tiny saved model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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
         "unknown method 'warp-drive'; valid: plain, plain-again, prompt-lookup, lookahead, lookahead-small, lookahead-window"),
        (["bench", "--workloads", "poetry,chat,jokes"],
         "unknown workloads 'poetry', 'jokes'; valid: code-completion, code-editing, chat, rewrite"),
        (["bench", "--methods", ","], "no method given; valid: plain"),
        (["bench", "--dtype", "int3"], "invalid choice: 'int3'"),
        (["generate"], "the following arguments are required: --prompt"),
        (["generate", "--prompt", "hi", "--max-new-tokens", "0"], "must be a positive integer, got 0"),
        (["demo", "--max-new-tokens", "-1"], "must be a positive integer, got -1"),
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
    assert main(["generate", "--prompt", "hi", "--config", "tree_width=3", "--model", "/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert "unknown LookaheadConfig field 'tree_width'" in err and "tree_nodes" in err
    assert main(["generate", "--prompt", "hi", "--config", "tree_nodes=-1", "--model", "/nonexistent"]) == 2
    assert "tree_nodes" in capsys.readouterr().err


def test_module_entry_point_exit_status():
    proc = subprocess.run([sys.executable, "-m", "lookahead", "bench", "--methods", "nope"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "unknown method 'nope'; valid:" in proc.stderr


def test_generate_streams_the_plain_greedy_text(tiny_folder, capsys):
    folder, model, tok = tiny_folder
    prompt = "abcabcabcabcabc"
    assert main(["generate", "--model", folder, "--prompt", prompt, "--raw", "--max-new-tokens", "12",
                 "--config", "tree_nodes=6"]) == 0
    captured = capsys.readouterr()
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    plain = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    expected = tok.decode(plain[0, ids.shape[1]:], skip_special_tokens=True)
    assert captured.out == expected + "\n"
    assert "target calls" in captured.err and "tree_nodes=6" in captured.err
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
