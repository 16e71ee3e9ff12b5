"""The n-gram store across requests (``LookaheadDecoder(trie=store)``): what it buys, what it costs.

    python benchmarks/memory_store.py [--prompts 4] [--max-new-tokens 96] [--stream-tokens 1000000]
                                      [--capacity 1048576] [--json FILE] [--skip-model]

Part 1, SmolLM2-135M-Instruct (fp32, CPU, greedy): a workload of code prompts (HumanEval
completions, and standard-library functions with an edit instruction as chat messages) decoded in
passes, with a fresh ``LookaheadDecoder(trie=store)`` per request so that only the store carries
over, once with the default decoder and once with ``adaptive=False`` (the whole proposal verified
every step, so the store's drafts are not filtered by the cost budget):

- ``pass 1``: from an empty store (capacity 2**18, max_n 8);
- ``pass 2``: the same prompts again, the store kept from pass 1 (same process);
- ``pass 2, reloaded``: the store saved after pass 1 and loaded into a new trie, as after a restart.

Each pass reports tokens per target call (new tokens / forward passes of the model) and wall time
against plain ``generate`` measured in the same run, and checks every output against plain greedy.

Part 2 (run first, with only the tokenizer loaded, so that RSS is the store's): at least ``--stream-tokens`` tokens of real code (the Python standard library's
source, tokenized with SmolLM2's tokenizer, one request per file, inserted a few tokens at a time as
a decoder does) streamed through one store of ``--capacity`` nodes. Reports node count, evictions
and the process RSS as the stream goes, then the store's size on disk, save time and load time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lookahead.cache import NgramTrie, tokenizer_identity  # noqa: E402


def rss_mib() -> tuple[float, float]:
    """(current, peak) resident set size of this process, MiB (Linux ``/proc``; NaN elsewhere)."""
    cur = peak = float("nan")
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    cur = int(line.split()[1]) / 1024
                elif line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) / 1024
    except OSError:
        pass
    return cur, peak


def trie_bytes(trie: NgramTrie) -> int:
    return sum(a.nbytes for a in (trie._nodes, trie._stats, trie._table, trie._state))


# -- part 1: passes over a workload --------------------------------------------------------------

MODES = {"default (adaptive budget)": {}, "adaptive=False (full proposal verified)": {"adaptive": False}}


def workload(n_prompts: int):
    """Code prompts: half HumanEval completions (the answer is not in the prompt), half stdlib edits
    (the answer mostly copies the prompt's code, so the request's own trie already drafts it)."""
    from benchmarks.workloads import code_completion, code_editing

    return code_completion((n_prompts + 1) // 2) + code_editing(n_prompts // 2)


def run_passes(model, tok, n_prompts: int, max_new_tokens: int, workdir: str) -> dict:
    import torch

    from benchmarks.runner import encode
    from lookahead import LookaheadDecoder

    prompts = workload(n_prompts)
    inputs = [encode(p, tok, model.device) for p in prompts]
    kw = dict(max_new_tokens=max_new_tokens, do_sample=False)
    model.generate(**inputs[0], max_new_tokens=4, do_sample=False)  # warm-up
    model.generate(**inputs[0], max_new_tokens=4, custom_generate=LookaheadDecoder())  # + calibration

    plain, t_plain = [], []
    print("   plain generate ...", flush=True)
    for x in inputs:
        t = time.perf_counter()
        plain.append(model.generate(**x, **kw))
        t_plain.append(time.perf_counter() - t)
    vocab, ident = len(tok), tokenizer_identity(tok)

    def one_pass(name: str, trie: NgramTrie, settings: dict) -> dict:
        rows = []
        for p, x, ref, tp in zip(prompts, inputs, plain, t_plain):
            dec = LookaheadDecoder(trie=trie, **settings)  # fresh per request: only the store carries over
            t = time.perf_counter()
            out = model.generate(**x, custom_generate=dec, max_new_tokens=max_new_tokens)
            dt = time.perf_counter() - t
            s = dec.stats
            rows.append(dict(prompt=p.id, new_tokens=s.new_tokens, target_calls=s.target_calls,
                             from_store=s.accepted_by_origin["memory"], seconds=dt, plain_seconds=tp,
                             identical=bool(torch.equal(out, ref))))
        new = sum(r["new_tokens"] for r in rows)
        calls = sum(r["target_calls"] for r in rows)
        return dict(name=name, prompts=rows, new_tokens=new, target_calls=calls, tokens_per_call=new / calls,
                    tokens_from_store=sum(r["from_store"] for r in rows),
                    speedup_total=sum(r["plain_seconds"] for r in rows) / sum(r["seconds"] for r in rows),
                    identical=all(r["identical"] for r in rows), store_nodes=len(trie))

    modes = []
    for label, settings in MODES.items():
        store = NgramTrie(max_n=8, capacity=1 << 18)
        path = os.path.join(workdir, "pass1.ngt")
        print(f"   {label}: pass 1 ...", flush=True)
        p1 = one_pass("pass 1 (empty store)", store, settings)
        store.save(path, vocab_size=vocab, tokenizer_id=ident)
        t = time.perf_counter()
        reloaded = NgramTrie.load(path, vocab_size=vocab, tokenizer_id=ident)
        t_load = time.perf_counter() - t
        print(f"   {label}: pass 2 ...", flush=True)
        p2 = one_pass("pass 2 (store kept)", store, settings)
        p2r = one_pass("pass 2 (store reloaded)", reloaded, settings)
        modes.append(dict(mode=label, settings=settings, passes=[p1, p2, p2r],
                          store_file_bytes=os.path.getsize(path), store_load_seconds=t_load))
    return dict(prompts=[p.id for p in prompts], max_new_tokens=max_new_tokens, plain_seconds=t_plain,
                modes=modes)


# -- part 2: a million tokens through one store ----------------------------------------------------


def code_token_stream(tok, n_tokens: int):
    """(file name, token ids) of standard-library source files, sorted by path, until n_tokens."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # "sequence longer than the model's maximum" is irrelevant here
    root = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(root.rglob("*.py")):
        if "test" in path.parts or "site-packages" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        ids = np.asarray(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
        if len(ids) == 0:
            continue
        yield str(path.relative_to(root)), ids
        total += len(ids)
        if total >= n_tokens:
            return


def stream_million(tok, n_tokens: int, capacity: int, workdir: str) -> dict:
    t = time.perf_counter()
    requests = [ids for _, ids in code_token_stream(tok, n_tokens)]  # tokenized first: RSS below is the store's
    t_tokenize = time.perf_counter() - t
    NgramTrie(max_n=2, capacity=16)  # Numba and the compiled kernels, so that they are not counted below
    rss0 = rss_mib()
    store = NgramTrie(max_n=8, capacity=capacity)
    rss_alloc = rss_mib()
    vocab, ident = len(tok), tokenizer_identity(tok)
    rng = np.random.default_rng(0)
    points, total, files, next_report = [], 0, 0, 0
    t_insert = 0.0
    for ids in requests:
        store.reset_stream()  # one request per file
        cuts = np.cumsum(rng.integers(1, 8, len(ids) // 2 + 1))  # 1-7 tokens a step, as a decoder inserts
        cuts = cuts[cuts < len(ids)]
        t = time.perf_counter()
        for chunk in np.split(ids, cuts):
            store.insert(chunk)
        t_insert += time.perf_counter() - t
        total += len(ids)
        files += 1
        if total >= next_report:
            points.append(dict(tokens=total, nodes=len(store), evictions=store.n_evictions, rss_mib=rss_mib()[0]))
            next_report += n_tokens // 4
    if points[-1]["tokens"] != total:
        points.append(dict(tokens=total, nodes=len(store), evictions=store.n_evictions, rss_mib=rss_mib()[0]))
    rss_stream = rss_mib()
    path = os.path.join(workdir, "million.ngt")
    t = time.perf_counter()
    store.save(path, vocab_size=vocab, tokenizer_id=ident)
    t_save = time.perf_counter() - t
    loads = []
    for _ in range(3):
        t = time.perf_counter()
        loaded = NgramTrie.load(path, vocab_size=vocab, tokenizer_id=ident)
        loads.append(time.perf_counter() - t)
    # the loaded store proposes exactly what the original does
    ctxs = [requests[0][i : i + 3] for i in range(0, min(3000, len(requests[0]) - 3), 7)]
    same = all(np.array_equal(store.propose(c, 12, 6, 3)[0], loaded.propose(c, 12, 6, 3)[0]) for c in ctxs)
    return dict(tokens=total, files=files, tokenize_seconds=t_tokenize, capacity=capacity, max_n=8, nodes=len(store),
                evictions=store.n_evictions, within_capacity=len(store) <= capacity,
                trie_array_mib=trie_bytes(store) / 2**20, rss_mib_before=rss0[0], rss_mib_allocated=rss_alloc[0],
                rss_mib_after=rss_stream[0], rss_peak_mib_stream=rss_stream[1],
                rss_mib_after_loads=rss_mib()[0], insert_us_per_token=t_insert / total * 1e6,
                progress=points, file_bytes=os.path.getsize(path), save_seconds=t_save,
                load_seconds_median=statistics.median(loads), load_seconds_all=loads,
                loaded_equal=bool(same and len(loaded) == len(store) and loaded.step == store.step))


# -- main --------------------------------------------------------------------------------------------


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--stream-tokens", type=int, default=1_000_000)
    ap.add_argument("--capacity", type=int, default=1 << 20)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--skip-model", action="store_true", help="part 2 only (skips the passes)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: stable on a shared machine, where two multi-threaded "
                         "processes on the same cores slow each other down many times over)")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)

    from benchmarks.runner import _git_state
    from lookahead.models import load_smollm2, smollm2_location

    results: dict = {"git": _git_state(), "command": " ".join(sys.argv)}
    print(f"checkout: {results['git']}")
    from transformers import AutoTokenizer

    folder, name = smollm2_location()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    print(f"torch threads {torch.get_num_threads()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        # part 2 first, with only the tokenizer loaded, so that RSS shows the store and nothing else
        s = results["stream"] = stream_million(tok, args.stream_tokens, args.capacity, workdir)
        print(f"\n== part 2: {s['tokens']} tokens of stdlib source ({s['files']} files, one request each) "
              f"through one store, max_n={s['max_n']}, capacity {s['capacity']}")
        for pt in s["progress"]:
            print(f"  after {pt['tokens']:>8} tokens: {pt['nodes']:>8} nodes, {pt['evictions']:>3} evictions, "
                  f"RSS {pt['rss_mib']:.0f} MiB")
        print(f"nodes {s['nodes']} <= capacity {s['capacity']}: {s['within_capacity']}; trie arrays "
              f"{s['trie_array_mib']:.1f} MiB; RSS before the store {s['rss_mib_before']:.0f} MiB, after allocating "
              f"{s['rss_mib_allocated']:.0f} MiB, after the stream {s['rss_mib_after']:.0f} MiB "
              f"(peak {s['rss_peak_mib_stream']:.0f}; {s['rss_mib_after_loads']:.0f} with a loaded copy alive); "
              f"insert {s['insert_us_per_token']:.2f} us/token")
        print(f"on disk: {s['file_bytes'] / 2**20:.1f} MiB ({s['file_bytes'] / s['nodes']:.1f} bytes/node); save "
              f"{s['save_seconds'] * 1e3:.0f} ms; load {s['load_seconds_median'] * 1e3:.0f} ms (median of 3); "
              f"loaded store proposes identically: {s['loaded_equal']}", flush=True)
        if not args.skip_model:
            t = time.perf_counter()
            model, tok = load_smollm2()
            print(f"\nSmolLM2-135M-Instruct loaded in {time.perf_counter() - t:.0f} s", flush=True)
            r = results["passes"] = run_passes(model, tok, args.prompts, args.max_new_tokens, workdir)
            print(f"\n== part 1: {len(r['prompts'])} code prompts ({', '.join(r['prompts'])}), "
                  f"max_new_tokens={r['max_new_tokens']}, greedy, a fresh decoder per request, "
                  "store max_n=8 capacity 2**18")
            for m in r["modes"]:
                print(f"-- decoder {m['mode']}")
                print(f"{'pass':<26}{'tokens':>7}{'calls':>7}{'tok/call':>9}{'from store':>11}{'vs plain':>9}  exact")
                for p in m["passes"]:
                    print(f"{p['name']:<26}{p['new_tokens']:>7}{p['target_calls']:>7}{p['tokens_per_call']:>9.2f}"
                          f"{p['tokens_from_store']:>11}{p['speedup_total']:>8.2f}x  {'yes' if p['identical'] else 'NO'}")
                for i, pid in enumerate(r["prompts"]):
                    cells = "  ".join(f"{p['prompts'][i]['new_tokens'] / p['prompts'][i]['target_calls']:5.2f}"
                                      for p in m["passes"])
                    print(f"   {pid:<28} tok/call by pass: {cells}")
                print(f"   store after pass 1: {m['passes'][0]['store_nodes']} nodes, {m['store_file_bytes']} bytes "
                      f"on disk, loaded in {m['store_load_seconds'] * 1e3:.1f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
