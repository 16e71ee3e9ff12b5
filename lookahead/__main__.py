"""``python -m lookahead`` and the ``lookahead`` console script: the command line of ``lookahead.tools.cli``."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from lookahead.tools.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
