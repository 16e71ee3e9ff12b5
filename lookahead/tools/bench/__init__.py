"""``python -m lookahead bench``: ``workloads`` and ``methods`` side by side (``runner``), then ``report``."""
