"""Instructions a decode executes, counted by Valgrind's callgrind: the noise-free side of ``host_overhead.py``.

On a shared VM the host work of a step moves by 5-10% from run to run, as much as most changes to it. The count of
instructions executed does not depend on the load. It misses what a cache miss or a mispredicted branch costs, so
it is the companion of the timed A/B, not its replacement.

    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=OUT python count.py METHOD [CALLS] [ROWS]

Builds ``host_overhead.py``'s tiny model, prompt and decoder for ``METHOD`` (``never``, ``always``, ``flat``), runs
one call uncounted (compilation, first-call costs; ``ROWS`` rows per call, default 1: a batch), then switches the
count on (``callgrind_control -i on``) for
``CALLS`` calls of a fresh decoder each (300 new tokens) and off again. The plugin is whichever ``lookahead`` is
first on ``PYTHONPATH``, so one script counts any checkout. Prints the steps and where ``lookahead`` came from.
``run.sh`` runs it for two checkouts and ``compare.py`` reads the counts per step.
"""

import os
import subprocess
import sys

import torch

from benchmarks.host_overhead import generate, make_decoder, prompt_ids, tiny_model


def main() -> None:
    import lookahead

    method = sys.argv[1]
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    rows = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    torch.set_num_threads(1)
    model, ids = tiny_model(), prompt_ids(rows)
    generate(model, ids, make_decoder(method, rows), 300)
    decoders = [make_decoder(method, rows) for _ in range(calls)]
    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], capture_output=True, check=False)
    for decoder in decoders:
        generate(model, ids, decoder, 300)
    subprocess.run(["callgrind_control", "-i", "off", str(os.getpid())], capture_output=True, check=False)
    print(f"method {method} calls {calls} rows {rows} steps {sum(len(d.stats.budgets) for d in decoders)} "
          f"lookahead {os.path.dirname(lookahead.__file__)}")


if __name__ == "__main__":
    main()
