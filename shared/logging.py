"""structlog, configured once per process; the standard library's records rendered alike."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

#: The stdlib logger every structlog event goes out through (already filtered by level).
EVENTS_LOGGER = "sophos"


def configure_logging(
    log_format: str = "auto", level: int = logging.INFO, *, trace_ids: bool = False
) -> None:
    """JSON lines (``json``) or readable lines (``console``) on stderr; ``auto``:
    readable on a terminal, JSON otherwise (a file, a pipe, a container's log).

    Context (run_id, conversation_id, job_id) is bound with
    ``structlog.contextvars.bind_contextvars`` at the start of a job or request;
    ``trace_ids`` (tracing on, shared/tracing.py): each event made while a span is
    current carries its ``trace_id`` and ``span_id``.

    One handler writes every line: our events and the records of the libraries that log
    through the standard library (uvicorn, arq, LangGraph, httpx, asyncio, warnings),
    rendered by the same renderer through structlog's ``ProcessorFormatter``. One
    handler, one lock, one write per line: lines from several threads never interleave.
    """
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if trace_ids:
        from shared.tracing import add_trace_ids

        shared.append(add_trace_ids)
    renderer: structlog.types.Processor
    if log_format == "auto":
        log_format = "console" if sys.stderr.isatty() else "json"
    if log_format == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    else:
        renderer = structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=_events_logger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        # Records of other libraries: named by their logger, stamped like ours.
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    # Libraries at WARNING (httpx logs each request at INFO, arq each job); ours as filtered above.
    logging.basicConfig(level=logging.WARNING, handlers=[handler], force=True)
    logging.getLogger(EVENTS_LOGGER).setLevel(logging.DEBUG)
    logging.getLogger("arq").setLevel(logging.WARNING)
    logging.captureWarnings(True)  # warnings.warn(...) is a record of "py.warnings", not raw text


def _events_logger(*_args: Any) -> logging.Logger:
    return logging.getLogger(EVENTS_LOGGER)
