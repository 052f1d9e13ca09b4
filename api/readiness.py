"""Readiness: Redis, the database, a live worker and the model, checked side by side."""

from __future__ import annotations

import asyncio
import json

import httpx
import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from api.schemas import ReadinessChecks, WorkerInfo
from api.store import Store
from shared.contracts import WORKER_HEARTBEAT
from shared.errors import NotReady, SophosError
from shared.schema import MIGRATIONS
from shared.settings import Settings

log = structlog.get_logger(__name__)

MODEL_CHECK_SECONDS = 2.0


class NotReadyError(NotReady):
    """503 NOT_READY, naming what is missing; the answer also carries every check."""

    def __init__(self, checks: ReadinessChecks, worker: WorkerInfo | None = None) -> None:
        super().__init__(f"not ready: {', '.join(checks.missing())}")
        self.checks = checks
        #: the worker's heartbeat as /api/runs shows it (None: unknown)
        self.worker = worker


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


async def _redis(redis: Redis) -> bool:
    try:
        return bool(await redis.ping())
    except (RedisError, OSError) as exc:
        log.info("readyz.redis_down", error=str(exc))
        return False


async def _worker(redis: Redis) -> tuple[bool, dict[str, str]]:
    """Is a worker alive, and the state of each of its MCP servers (from its heartbeat)."""
    try:
        raw = await redis.get(WORKER_HEARTBEAT)
    except (RedisError, OSError):
        return False, {}
    if raw is None:
        return False, {}
    try:
        servers = json.loads(raw).get("mcp") or {}
    except (ValueError, AttributeError):
        servers = {}
    return True, {str(k): str(v) for k, v in servers.items()} if isinstance(servers, dict) else {}


async def _database(store: Store) -> bool:
    try:
        version = await store.schema_version()
    except SophosError as exc:
        log.info("readyz.database_unreadable", error=exc.message)
        return False
    return version is not None and version >= len(MIGRATIONS)


async def _model(http: httpx.AsyncClient, settings: Settings) -> bool:
    try:
        response = await http.get(f"{settings.ollama_host}/api/tags", timeout=MODEL_CHECK_SECONDS)
        return response.status_code == 200 and model_listed(response.json(), settings.ollama_model)
    except (httpx.HTTPError, ValueError) as exc:
        log.info("readyz.model_unreachable", error=f"{type(exc).__name__}: {exc}")
        return False


async def check(redis: Redis, store: Store, http: httpx.AsyncClient, settings: Settings) -> ReadinessChecks:
    ok_redis, ok_database, (ok_worker, tool_servers), ok_model = await asyncio.gather(
        _redis(redis), _database(store), _worker(redis), _model(http, settings)
    )
    return ReadinessChecks(
        redis=ok_redis, database=ok_database, worker=ok_worker, model=ok_model, tool_servers=tool_servers
    )
