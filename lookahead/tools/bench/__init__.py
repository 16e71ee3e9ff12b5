"""The decoder against plain ``generate`` and prompt lookup, side by side (``python -m lookahead bench``).

``workloads`` (prompts from local material, nothing downloaded), ``methods`` (the registry of decoding methods by
name), ``runner`` (``run_bench``: interleaved runs on one model, per-prompt figures) and ``report``
(``write_reports``: the JSON file, the Markdown tables and the PNG plot).
"""
