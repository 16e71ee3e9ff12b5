"""The tools around the decoder, which never imports them: ``python -m lookahead`` (``cli``) and its commands
(``generate``, ``demo``, ``warmup``, ``bench``), the log lines and thread count (``console``), model loading
(``models``) and plots (``plots``)."""
