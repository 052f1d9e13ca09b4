"""Readiness: Redis, the database, a live worker and the model, checked side by side."""

from __future__ import annotations

import asyncio

import httpx
import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from api.ops.schemas import ReadinessChecks
from api.runs.schemas import WorkerInfo
from api.store import Store
from shared.errors import NotReady, SophosError
from shared.model_probe import ModelCheck, probe
from shared.redis.liveness import read_liveness
from shared.settings import Settings
from shared.storage.schema import MIGRATIONS

log = structlog.get_logger(__name__)

MODEL_CHECK_SECONDS = 2.0


class NotReadyError(NotReady):
    """503 NOT_READY, naming what is missing; the answer also carries every check.

    A missing model is named with its host and the command that fixes it.
    """

    def __init__(
        self, checks: ReadinessChecks, worker: WorkerInfo | None = None, model: ModelCheck | None = None
    ) -> None:
        message = f"not ready: {', '.join(checks.missing())}"
        if model is not None and not model.ready:
            message += f"; {model.describe()}"
        super().__init__(message)
        self.checks = checks
        #: the worker's heartbeat as /api/runs shows it (None: unknown)
        self.worker = worker


async def _redis(redis: Redis) -> bool:
    try:
        return bool(await redis.ping())
    except (RedisError, OSError) as exc:
        log.info("readyz.redis_down", error=str(exc))
        return False


async def _worker(redis: Redis) -> tuple[bool, dict[str, str]]:
    """Is any worker alive, and the state of each MCP server (from the newest live beat)."""
    try:
        liveness = await read_liveness(redis)
    except (RedisError, OSError):
        return False, {}
    if not liveness.alive or liveness.beat is None or not liveness.workers:
        return liveness.alive, {}
    return True, dict(liveness.beat.tool_servers)


async def _database(store: Store) -> bool:
    try:
        version = await store.schema_version()
    except SophosError as exc:
        log.info("readyz.database_unreadable", error=exc.message)
        return False
    return version is not None and version >= len(MIGRATIONS)


async def _model(http: httpx.AsyncClient, settings: Settings) -> ModelCheck:
    found = await probe(http, settings.ollama_host, settings.ollama_model, MODEL_CHECK_SECONDS)
    if not found.ready:
        log.info("readyz.model_missing", problem=found.state.value, error=found.detail)
    return found


async def check(
    redis: Redis, store: Store, http: httpx.AsyncClient, settings: Settings
) -> tuple[ReadinessChecks, ModelCheck]:
    """Every check, and what the model check found (for the message that names host and model)."""
    ok_redis, ok_database, (ok_worker, tool_servers), model = await asyncio.gather(
        _redis(redis), _database(store), _worker(redis), _model(http, settings)
    )
    checks = ReadinessChecks(
        redis=ok_redis, database=ok_database, worker=ok_worker, model=model.ready, tool_servers=tool_servers
    )
    return checks, model
