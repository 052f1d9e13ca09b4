"""The API's app for Granian (bench figure 19 only): what ``python -m api`` builds, without uvicorn.

Granian imports this in its worker process and calls :func:`app`. It reads the same settings,
logs the same way and builds the same Litestar app; what uvicorn's side of ``api/__main__.py``
adds is not here: the listening socket's ``TCP_USER_TIMEOUT`` (a client that stops reading),
the drain flag set by SIGTERM (streams end before the graceful stop) and h11's bound on a
request's head (Granian's own ``--http1-buffer-size`` bounds its buffer instead).
"""

from __future__ import annotations

import os
import threading

from litestar import Litestar


def app() -> Litestar:
    os.environ.setdefault("LANGGRAPH_STRICT_MSGPACK", "true")
    from api.app import create_app
    from shared.logging import configure_logging
    from shared.settings import Settings
    from shared.speedups import Speedups

    settings = Settings.from_env()
    speedups = Speedups.of(settings)
    configure_logging(settings.log_format)
    speedups.apply_json_codec()
    return create_app(settings, draining=threading.Event())
