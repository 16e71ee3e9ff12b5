"""``python -m lookahead bench``: ``workloads`` (prompts), ``methods`` (decoding methods by name), ``runner``
(``run_bench``: interleaved runs, per-prompt figures) and ``report`` (``write_reports``: JSON, Markdown, PNG)."""
