"""The fast libraries a process may run on: uvloop, hiredis, msgspec, httptools.

``EVENT_LOOP``, ``REDIS_PARSER``, ``JSON_CODEC`` and ``API_HTTP`` choose each; ``auto`` takes
the fast one when it is installed, else the plain one (asyncio's loop, redis-py's own parser,
the standard library's ``json``, h11). Each entry point resolves them once, next to its
settings, so a choice that cannot be had (``uvloop`` when it is not installed) stops
the process at start-up with the variable named, like any other bad setting.

None of them changes what crosses Redis or HTTP: an event loop, a reply parser and an HTTP
parser bounded alike (api/http/parser.py) are invisible on the wire, and the codec's output parses
the same as ``json``'s (see :func:`shared.contracts.codec.use_json_codec`). Bench figure 12
measures each on and off.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import DefaultParser
from redis.utils import HIREDIS_AVAILABLE

from shared.compat import redis_parsers
from shared.contracts import codec
from shared.settings import Settings
from shared.settings_parsing import SettingsError


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _pick(variable: str, choice: str, fast: str, plain: str, available: bool) -> str:
    if choice == "auto":
        return fast if available else plain
    if choice == fast and not available:
        raise SettingsError(variable, f"{fast} is not installed (choose {plain} or auto)")
    return choice


@dataclass(frozen=True, slots=True)
class Speedups:
    """The resolved choices: ``uvloop``/``asyncio``, ``hiredis``/``python``, ``msgspec``/``json``."""

    event_loop: str
    redis_parser: str
    json_codec: str
    api_http: str

    @classmethod
    def of(cls, settings: Settings) -> Speedups:
        """Resolve ``auto``; raises :class:`SettingsError` for a choice that is not installed."""
        return cls(
            event_loop=_pick("EVENT_LOOP", settings.event_loop, "uvloop", "asyncio", _installed("uvloop")),
            redis_parser=_pick("REDIS_PARSER", settings.redis_parser, "hiredis", "python", HIREDIS_AVAILABLE),
            json_codec=_pick("JSON_CODEC", settings.json_codec, "msgspec", "json", _installed("msgspec")),
            api_http=_pick("API_HTTP", settings.api_http, "httptools", "h11", _installed("httptools")),
        )

    def loop_factory(self) -> Callable[[], asyncio.AbstractEventLoop]:
        if self.event_loop == "uvloop":
            import uvloop

            return uvloop.new_event_loop
        return asyncio.new_event_loop

    def parser_class(self) -> type[Any]:
        """redis-py's parser class for the choice (``parser_class`` of a connection pool)."""
        hiredis, python = redis_parsers()
        return hiredis if self.redis_parser == "hiredis" else python

    def apply_json_codec(self) -> None:
        codec.use_json_codec(self.json_codec)


async def use_parser(redis: Redis, parser_class: type[Any]) -> None:
    """Have every connection of ``redis``'s pool, open or not yet, parse with ``parser_class``.

    For a pool made by someone else (arq's ``create_pool``, which takes no parser):
    a connection keeps the parser it was made with, so the ones already made are dropped.
    """
    pool = redis.connection_pool
    if pool.connection_kwargs.get("parser_class", DefaultParser) is parser_class:
        return
    pool.connection_kwargs["parser_class"] = parser_class
    await pool.disconnect()
    pool.reset()


def in_use(redis: Redis) -> dict[str, str]:
    """What this process runs on, read from its loop, pool and codec (for its start-up log)."""
    hiredis, _ = redis_parsers()
    loop = type(asyncio.get_running_loop()).__module__.partition(".")[0]
    parser = redis.connection_pool.connection_kwargs.get("parser_class", DefaultParser)
    return {
        "event_loop": "uvloop" if loop == "uvloop" else "asyncio",
        "redis_parser": "hiredis" if issubclass(parser, hiredis) else "python",
        "json_codec": codec.json_codec(),
    }
