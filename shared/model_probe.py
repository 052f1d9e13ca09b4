"""Is the model there? One look at Ollama's ``GET /api/tags``, and what to tell the user.

The worker looks once at start (and logs), the launcher prints the same line,
readyz asks on every call, and a run failing with MODEL_UNAVAILABLE gives the
same fix (worker/agent/model_check.py): one wording for one problem, wherever it shows.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import httpx

from shared.redaction import redact_url

#: a look at the model server must not hold anything up for long
PROBE_SECONDS = 2.0


class ModelState(enum.StrEnum):
    READY = "ready"
    #: nothing answers at OLLAMA_HOST (refused, timed out, not HTTP)
    UNREACHABLE = "unreachable"
    #: the server answers, but OLLAMA_MODEL is not among its models
    NOT_PULLED = "not_pulled"
    #: something answers, but not as Ollama does
    UNEXPECTED = "unexpected"


@dataclass(frozen=True, slots=True)
class ModelCheck:
    state: ModelState
    #: OLLAMA_HOST as it may be shown: without its password (it goes to logs and answers)
    host: str
    model: str
    #: what went wrong, in the library's words (empty when ready)
    detail: str = ""

    @property
    def ready(self) -> bool:
        return self.state is ModelState.READY

    def describe(self) -> str:
        """One line naming the host and the model, what is wrong and the command that fixes it."""
        return describe(self.state, self.host, self.model, self.detail)


def describe(state: ModelState, host: str, model: str, detail: str = "") -> str:
    host = redact_url(host)
    where = f"the model {model!r} at {host}"
    because = f" ({detail})" if detail else ""
    if state is ModelState.READY:
        return f"{where} is ready"
    if state is ModelState.UNREACHABLE:
        return (f"{where} is not available: Ollama is not reachable{because}; "
                f"start it with `ollama serve`, or set OLLAMA_HOST")
    if state is ModelState.NOT_PULLED:
        return (f"{where} is not available: the model is not pulled; "
                f"run `ollama pull {model}`, or set OLLAMA_MODEL")
    return f"{where} is not available: {host} does not answer as Ollama does{because}; check OLLAMA_HOST"


def _with_tag(name: str) -> str:
    """``qwen3`` and ``qwen3:latest`` name the same model; a tag follows the last ``/``."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def model_listed(tags: object, model: str) -> bool:
    """Whether an Ollama ``/api/tags`` body lists ``model``."""
    if not isinstance(tags, dict) or not isinstance(tags.get("models"), list):
        return False
    wanted = _with_tag(model)
    for entry in tags["models"]:
        if isinstance(entry, dict):
            for key in ("name", "model"):
                if isinstance(entry.get(key), str) and _with_tag(entry[key]) == wanted:
                    return True
    return False


def classify(response: httpx.Response, host: str, model: str) -> ModelCheck:
    if response.status_code != 200:
        detail = f"GET /api/tags answered {response.status_code}"
        return ModelCheck(ModelState.UNEXPECTED, host, model, detail)
    try:
        tags = response.json()
    except ValueError:
        return ModelCheck(ModelState.UNEXPECTED, host, model, "GET /api/tags did not answer JSON")
    if not isinstance(tags, dict) or not isinstance(tags.get("models"), list):
        return ModelCheck(ModelState.UNEXPECTED, host, model, "GET /api/tags has no list of models")
    if not model_listed(tags, model):
        return ModelCheck(ModelState.NOT_PULLED, host, model)
    return ModelCheck(ModelState.READY, host, model)


def _unreachable(host: str, model: str, exc: httpx.HTTPError) -> ModelCheck:
    return ModelCheck(ModelState.UNREACHABLE, host, model, f"{type(exc).__name__}: {exc}".rstrip(": "))


async def probe(
    http: httpx.AsyncClient, host: str, model: str, seconds: float = PROBE_SECONDS
) -> ModelCheck:
    """Ask ``host`` for its models (never raises)."""
    try:
        response = await http.get(f"{host.rstrip('/')}/api/tags", timeout=seconds)
    except httpx.HTTPError as exc:
        return _unreachable(redact_url(host), model, exc)
    return classify(response, redact_url(host), model)


def probe_sync(host: str, model: str, timeout: float = PROBE_SECONDS) -> ModelCheck:
    """:func:`probe` for callers without an event loop (the launcher)."""
    try:
        with httpx.Client(trust_env=False) as http:
            response = http.get(f"{host.rstrip('/')}/api/tags", timeout=timeout)
    except httpx.HTTPError as exc:
        return _unreachable(redact_url(host), model, exc)
    return classify(response, redact_url(host), model)

