"""Where the tests keep what npm installs and builds: outside the checkout, kept between runs
(``SOPHOS_TEST_CACHE``, else ``~/.cache/sophos-tests``). Standard library only."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("SOPHOS_TEST_CACHE") or Path.home() / ".cache" / "sophos-tests")


#: how long one npm command that fetches (pack, install) may take
INSTALL_TIMEOUT = 120.0
