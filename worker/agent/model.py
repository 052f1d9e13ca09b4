"""The chat model (Ollama) and what its failures mean for a run."""

from __future__ import annotations

import httpx
import ollama
from langchain_ollama import ChatOllama

from shared.settings import Settings
from shared.tls import default_context


def build_model(settings: Settings, model: str | None = None) -> ChatOllama:
    """The chat model: ``OLLAMA_MODEL``, or ``model`` (an assistant's) on the same Ollama."""
    return ChatOllama(
        base_url=settings.ollama_host,
        model=model or settings.ollama_model,
        reasoning=settings.ollama_think,
        # (ChatOllama passes them to its sync and its async client alike.)
        client_kwargs={"timeout": settings.model_timeout, "verify": default_context()},
    )


def is_model_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) says the model cannot be reached or is missing."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, httpx.TransportError | ConnectionError):
            return True  # refused, reset, dropped mid-stream, timed out
        if isinstance(current, ollama.ResponseError) and (
            current.status_code == 404 or current.status_code >= 500
        ):
            return True  # unknown model, or the server failing
        current = current.__cause__ or current.__context__
    return False
