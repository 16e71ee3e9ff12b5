"""``python -m lookahead`` and the ``lookahead`` console script: the command line of ``lookahead.tools.cli``."""

import sys

from lookahead.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
