"""structlog, configured once per process."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(log_format: str = "auto", level: int = logging.INFO) -> None:
    """JSON lines (``json``) or readable lines (``console``) on stderr; ``auto``:
    readable on a terminal, JSON otherwise (a file, a pipe, a container's log).

    Context (run_id, conversation_id, job_id) is bound with
    ``structlog.contextvars.bind_contextvars`` at the start of a job or request.
    """
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor
    if log_format == "auto":
        log_format = "console" if sys.stderr.isatty() else "json"
    if log_format == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    else:
        renderer = structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Libraries (arq, uvicorn, httpx) log through the standard library.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    logging.getLogger("arq").setLevel(logging.WARNING)
