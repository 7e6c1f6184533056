"""``python -m vargather``: the command line (``vargather._cli`` has the commands)."""

from __future__ import annotations

import sys

from vargather._cli import main

if __name__ == "__main__":
    sys.exit(main())
