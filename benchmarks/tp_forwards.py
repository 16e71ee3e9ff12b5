"""Forwards per call under tensor parallelism: does a sharded model's call run only its decoding steps?

    python -m benchmarks.tp_forwards [--calls 3] [--tokens 32] [--out benchmarks/results/tp-forwards.json]

Starts ``torchrun --standalone --nproc-per-node 2`` (gloo, one thread per rank) on this file. Each rank loads a
tiny random Llama (float32, 4 attention heads) with ``tp_plan="auto"`` and runs ``--calls`` successive greedy calls
of ``--tokens`` new tokens on a prompt that repeats, each with a fresh default ``LookaheadDecoder()`` and an empty
``LOOKAHEAD_CACHE`` (no kept cost curve, the clock real). A forward pre-hook on the model counts every forward of
a call, whatever made it (decoding steps, prefill, any timing the decoder might do); ``steps`` is the decoder's own
count of target calls. The goal: from the second call on, forwards < new tokens, and forwards = steps on every call.
The outputs are compared with plain ``generate`` on the same sharded model.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

PROMPT = [1, 5, 9, 11, 5, 9, 11, 5, 9, 11, 4, 7, 5, 9, 11, 5, 9, 11]


def rank_main(model_dir: str, out_path: str, calls: int, tokens: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    from lookahead import LookaheadDecoder

    model = AutoModelForCausalLM.from_pretrained(model_dir, distributed_config=DistributedConfig(tp_plan="auto"))
    model.eval()
    forwards = [0]
    model.register_forward_pre_hook(lambda module, args: forwards.__setitem__(0, forwards[0] + 1))
    ids = torch.tensor([PROMPT])
    plain = model.generate(ids, max_new_tokens=tokens, do_sample=False)
    rows = []
    for i in range(calls):
        decoder = LookaheadDecoder()
        forwards[0] = 0
        out = decoder_out = model.generate(ids, max_new_tokens=tokens, do_sample=False, custom_generate=decoder)
        rows.append({"call": i + 1, "forwards": forwards[0], "steps": decoder.stats.target_calls,
                     "new_tokens": decoder.stats.new_tokens, "identical_to_plain": torch.equal(decoder_out, plain),
                     "plain_reason": decoder.stats.plain_reason})
        del out
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump({"world": dist.get_world_size(), "prompt": PROMPT, "tokens": tokens, "calls": rows}, f,
                      indent=1)
    dist.destroy_process_group()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", help="write the rank-0 result here as JSON")
    args = ap.parse_args(argv)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2)
        LlamaForCausalLM(cfg).save_pretrained(os.path.join(tmp, "model"))
        out = os.path.join(tmp, "rank0.json")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "LOOKAHEAD_CACHE": os.path.join(tmp, "cache")}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--max-restarts", "0", os.path.abspath(__file__), "--rank-main", os.path.join(tmp, "model"), out,
               str(args.calls), str(args.tokens)]
        subprocess.run(cmd, env=env, check=True)
        result = json.load(open(out))
    for row in result["calls"]:
        print(f"call {row['call']}: {row['forwards']} forwards ({row['steps']} decoding steps) for "
              f"{row['new_tokens']} new tokens; identical to plain: {row['identical_to_plain']}"
              + (f"; decoded plain: {row['plain_reason']}" if row["plain_reason"] else ""))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-main":
        rank_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
