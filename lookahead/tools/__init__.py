"""The tools around the decoder, which never imports them: ``python -m lookahead`` (``cli``) and its parts."""
