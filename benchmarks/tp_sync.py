"""What synchronising the ranks costs under tensor parallelism, next to a sharded forward's own time.

    torchrun --standalone --nproc-per-node 2 benchmarks/tp_sync.py [--out benchmarks/results/tp-sync.json]

On every rank: the per-call time of ``lookahead.parallel.RankSync``'s collectives (a step's
``check`` with the fields a decode step would compare, the same with ``shared`` floats, ``seeds``, the
``broadcast`` of a cost curve) and of a bare all-gather of the same message, then the forward time of two
random Llamas loaded with ``tp_plan="auto"`` (a tiny one and a 25M-parameter one) for 1, 16 and 64 new
tokens after a 128-token context, and of the same model unsharded in each process. Rank 0 prints the
medians (and writes them with ``--out``). The CPU cores are shared by both ranks; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist


def median_us(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        dist.barrier()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def sync_costs(repeats: int) -> dict:
    from lookahead.cost import CostModel
    from lookahead.parallel import RankSync, encode_message

    sync = RankSync(every=1)
    ids = torch.randint(0, 1000, (1, 64), generator=torch.Generator().manual_seed(0))  # a 64-row step
    pos = torch.arange(100, 164)[None]
    curve = CostModel([(k, 0.03 * (1 + k / 64)) for k in (1, 2, 4, 8, 16, 32, 64)])
    message = torch.from_numpy(encode_message(0, 1, {"inputs": (ids, pos)}))
    out = [torch.empty_like(message) for _ in range(sync.size)]
    step = iter(range(10**9))
    fields = {"inputs": (ids, pos), "mask": (64, 228), "cached": 100}
    return {
        "all_gather_message_us": median_us(lambda: dist.all_gather(out, message), repeats),
        "checksum_64_row_inputs_us": median_us(lambda: encode_message(0, 1, fields), repeats),
        "check_us": median_us(lambda: sync.check(next(step), **fields), repeats),
        "check_shared_us": median_us(lambda: sync.check(next(step), shared=(0.031,), **fields), repeats),
        "seeds_1_us": median_us(lambda: sync.seeds(1), repeats),
        "broadcast_curve_us": median_us(lambda: sync.broadcast(curve), repeats),
    }


def forward_costs(folder: str, repeats: int) -> dict:
    from transformers import AutoModelForCausalLM, DynamicCache
    from transformers.distributed import DistributedConfig

    tp = AutoModelForCausalLM.from_pretrained(folder, distributed_config=DistributedConfig(tp_plan="auto"))
    tp.eval()
    single = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.randint(0, tp.config.vocab_size, (1, 128 + 64), generator=torch.Generator().manual_seed(0))
    result = {}
    for name, model in (("tp", tp), ("single", single)):  # each rank times its own unsharded copy too
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=ids[:, :128], cache=cache, use_cache=True)
            for k in (1, 16, 64):
                pos = torch.arange(128, 128 + k)[None]

                def step(k=k, pos=pos, model=model, cache=cache):
                    model(input_ids=ids[:, 128 : 128 + k], position_ids=pos, cache=cache, use_cache=True)
                    cache.crop(-k)

                step()
                result[f"{name}_forward_{k}_us"] = median_us(step, repeats)
    return result


def make_model(folder: str, hidden: int, layers: int, vocab: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden,
                      num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
                      max_position_embeddings=1024)
    LlamaForCausalLM(cfg).eval().save_pretrained(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write rank 0's medians to this JSON file")
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    report = {"world": dist.get_world_size(), "torch": torch.__version__, "threads_per_rank": 1,
              "sync": sync_costs(args.repeats)}
    with tempfile.TemporaryDirectory() as tmp:
        models = {"tiny": (32, 2, 96), "medium": (512, 8, 8192)}  # hidden, layers, vocab
        for name, (hidden, layers, vocab) in models.items():
            folder = os.path.join(tmp, name) if rank == 0 else None
            box = [folder]
            dist.broadcast_object_list(box, src=0)
            if rank == 0:
                make_model(box[0], hidden, layers, vocab)
            dist.barrier()
            report[name] = {"hidden": hidden, "layers": layers, "vocab": vocab,
                            # 2 all-reduces per layer, the embedding's all-reduce, the LM head's all-gather
                            "collectives_per_forward": 2 * layers + 2,
                            **forward_costs(box[0], max(args.repeats // 10, 20))}
            dist.barrier()
    if rank == 0:
        print(json.dumps(report, indent=1))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
