"""``python -m autotune.cli``: the same entry point as the ``autotune`` script."""

from __future__ import annotations

import sys

from autotune.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
