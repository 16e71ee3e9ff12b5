"""The tools around the decoder: ``python -m lookahead`` and what it runs. The decoder never imports them.

- ``cli``: the command line (its parser and the commands); ``generate``, ``demo``, ``warmup``: three commands.
- ``console``: the library's log lines on stderr, timed phases, ``--threads auto``.
- ``models``: the bundled SmolLM2-135M-Instruct (``load_smollm2``) or any local model (``load_model``).
- ``bench``: decoding methods side by side on task workloads; ``plots``: the budget and bench plots.
"""
