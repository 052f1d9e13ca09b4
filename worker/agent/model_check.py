"""The worker's look at the model: once at start-up, and in a MODEL_UNAVAILABLE run's message.

Neither stops anything: the model may be pulled, or Ollama started, a minute
later, and the next run then simply works.
"""

from __future__ import annotations

import httpx
import ollama
import structlog

from shared.model_probe import ModelCheck, ModelState, describe, probe
from shared.redaction import redact_url
from shared.settings import Settings
from shared.tls import default_context

log = structlog.get_logger(__name__)


async def report_model(settings: Settings) -> ModelCheck:
    """Look at OLLAMA_HOST for OLLAMA_MODEL and log what is wrong (``model.missing``), with the fix."""
    async with httpx.AsyncClient(trust_env=False, verify=default_context()) as http:
        check = await probe(http, settings.ollama_host, settings.ollama_model)
    if check.ready:
        log.info("model.ready", host=check.host, model=check.model)
    else:
        log.warning("model.missing", problem=check.state.value, host=check.host, model=check.model,
                    message=check.describe())
    return check


def unavailable_message(exc: BaseException, settings: Settings) -> str:
    """The message of a run failed with MODEL_UNAVAILABLE: what happened, and the fix."""
    host, model = redact_url(settings.ollama_host), settings.ollama_model
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, httpx.ConnectError | ConnectionRefusedError):
            return describe(ModelState.UNREACHABLE, host, model, f"{type(current).__name__}: {current}")
        if isinstance(current, ollama.ResponseError) and current.status_code == 404:
            return describe(ModelState.NOT_PULLED, host, model)
        current = current.__cause__ or current.__context__
    # Dropped mid-answer, timed out, a server error: the server was there a moment ago.
    return (f"the model {model!r} at {host} is not available ({type(exc).__name__}: {exc}); "
            f"check that `ollama serve` runs and `ollama pull {model}` was done, "
            "then resume the conversation")
