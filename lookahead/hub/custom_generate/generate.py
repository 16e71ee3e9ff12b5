"""lookahead, exact speculative decoding without a draft model, as a transformers ``custom_generate`` method::

    model.generate(**inputs, custom_generate="<this folder or Hub repository>", trust_remote_code=True)

The method is the installed ``lookahead`` package's (``requirements.txt``); ``lookahead.hub`` documents it.
"""

from lookahead.hub import generate  # noqa: F401
