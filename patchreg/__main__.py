"""``python -m patchreg`` and the ``patchreg`` console script: ``list``, ``doctor``, ``show``."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit status (0 ok, 1 doctor found a problem, 2 usage error)."""
    from patchreg._cli import run

    try:
        return run(argv)
    except BrokenPipeError:  # `patchreg list | head`: stop quietly, as cat does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
