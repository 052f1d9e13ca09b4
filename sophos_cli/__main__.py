"""``python -m sophos_cli``: see :mod:`sophos_cli`."""

from __future__ import annotations

import sys

from sophos_cli.entry import main

if __name__ == "__main__":
    sys.exit(main())
