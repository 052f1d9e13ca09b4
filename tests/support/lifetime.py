from __future__ import annotations

import shutil
import threading
from collections.abc import Sequence


def die_with_test_run(argv: Sequence[str]) -> list[str]:
    """``argv`` prefixed so the process is SIGKILLed if the test run dies (Linux, setpriv).

    Teardown stops processes normally; this is for a pytest that is itself killed,
    which would otherwise leave redis-server, workers and APIs running. The parent
    death signal fires when the creating *thread* ends, so it is only used from the
    main thread; elsewhere, and where setpriv is missing, argv is returned as is.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return list(argv)
    return [setpriv, "--pdeathsig", "KILL", "--", *argv]
