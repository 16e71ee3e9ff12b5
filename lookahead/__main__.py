"""``python -m lookahead`` and the ``lookahead`` console script: the command line of ``lookahead.tools.cli``."""

from lookahead.tools.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
