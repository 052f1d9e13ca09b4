"""Everything the worker holds for its life, opened and closed in one place."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from typing import Any

import structlog
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.store.base import BaseStore
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared import tracing
from shared.redis.connection import connection_kwargs
from shared.redis.keys import WORKER_HEARTBEAT, WORKER_LAST_BEAT, WORKERS, worker_heartbeat_key
from shared.redis.liveness import connection_name, new_worker_id
from shared.redis.scripts import scripts
from shared.settings import Settings
from shared.speedups import in_use
from shared.storage.engines import open_checkpointer, open_item_store
from shared.users import adopt
from worker import faults
from worker.agent.graph import build_graph, read_system_prompt
from worker.agent.memory import WithMemory, memory_tools
from worker.agent.model import build_model
from worker.agent.model_calls import ModelCalls
from worker.agent.model_check import report_model
from worker.faults import Faults
from worker.metrics import TimedCheckpoints
from worker.run.lifetime.leases import Leases
from worker.run.lifetime.recovery import reconcile, recover
from worker.run.outcome.outcomes import UnrecordedOutcomes
from worker.run.service import RunService
from worker.schedule.crons.ticker import CronTicker
from worker.schedule.deadlines import ApprovalDeadlines
from worker.store import RunStore
from worker.tools.ledger.calls import Ledger
from worker.tools.mcp import McpToolbox, load_config
from worker.tools.policy import load_approvals, load_repeat
from worker.upkeep.expiry import ThreadExpiry
from worker.upkeep.pruning import Pruning
from worker.upkeep.retention import Retention
from worker.upkeep.sweep import ClaimSweep

log = structlog.get_logger(__name__)

HEARTBEAT_INTERVAL = 2.0
HEARTBEAT_TTL = 10


#: what the beat says of a tool: the first line of its description, this long at most
TOOL_DESCRIPTION_CHARS = 160


def tool_list(tools: Sequence[BaseTool]) -> list[dict[str, str]]:
    """The agent's tools as the beat names them (the empty page lists them, GET /api/agent)."""
    return [
        {"name": t.name, "description": first_line(t.description)[:TOOL_DESCRIPTION_CHARS]} for t in tools
    ]


def first_line(text: str | None) -> str:
    return (text or "").strip().split("\n", 1)[0]


async def _heartbeat(
    redis: Redis, worker_id: str, started_at: float, settings: Settings,
    tool_servers: Callable[[], dict[str, str]], tools: Callable[[], Sequence[BaseTool]],
    deferred_outcomes: Callable[[], int],
) -> None:
    body = {
        "id": worker_id, "host": socket.gethostname(), "pid": os.getpid(), "started_at": started_at,
        "concurrency": settings.worker_concurrency, "model": settings.ollama_model,
        "connection": connection_name(worker_id),
    }
    # Its own key and set member (several workers share a Redis), the aggregate for older
    # readers, and the last beat, which outlives the worker so "no worker since ..." can be told.
    keys = [worker_heartbeat_key(worker_id), WORKERS, WORKER_HEARTBEAT, WORKER_LAST_BEAT]
    while True:
        try:
            # ``mcp``: each tool server's state ("up" or why not), for readyz; ``deferred``: the
            # outcomes the database refused, still kept for a retry (only this process knows them);
            # ``tools``: the agent's tools now (a server that comes up late adds its own).
            beat = json.dumps({
                **body, "beat_at": time.time(), "mcp": tool_servers(), "deferred": deferred_outcomes(),
                "tools": tool_list(tools()),
            })
            await scripts(redis).beat(keys=keys, args=[worker_id, beat, HEARTBEAT_TTL])
        except RedisError as exc:
            log.warning("worker.heartbeat_failed", error=str(exc))
        await asyncio.sleep(HEARTBEAT_INTERVAL)


@asynccontextmanager
async def worker_resources(settings: Settings, redis: Redis) -> AsyncIterator[RunService]:
    """Open the database, checkpointer, MCP sessions and graph; recover; sweep claims; beat.

    Each step is a function below; the stack closes what they opened in reverse order.
    """
    async with AsyncExitStack() as stack:
        await report_model(settings)  # says what is missing; never stops the worker
        store = await RunStore.open(settings)
        stack.push_async_callback(store.close)
        fault = faults.load(settings)  # tests only (worker/faults.py)
        saver = await _open_saver(stack, settings, fault)
        if settings.auth_adopt_owner is not None:
            # After the saver's setup, which migrates PostgreSQL's tables: what was stored before
            # identities is AUTH_ADOPT_OWNER's from now on.
            adopted = await adopt(store.db, settings.auth_adopt_owner)
            log.info("users.adopted", owner=settings.auth_adopt_owner, conversations=adopted)
        toolbox = await _open_tools(stack, settings)
        # The Store's items (api/protocol/store.py): the graph's store, and the agent's memory tools.
        items = await stack.enter_async_context(open_item_store(settings))
        tools = WithMemory(toolbox.current, memory_tools(items))
        graph, ledger = _agent(settings, redis, store, saver, tools, toolbox.needs_approval, items, fault)
        service = RunService(settings=settings, redis=redis, store=store, graph=graph, ledger=ledger)
        recovered = await _recover_and_watch(stack, settings, redis, service, saver)
        log.info(
            "worker.ready", recovered_runs=recovered, tools=len(toolbox.tools),
            concurrency=settings.worker_concurrency, database=settings.database_name,
            lease_owner=store.owner, **in_use(redis),
        )
        stack.push_async_callback(service.unrecorded.close)
        await stack.enter_async_context(service.live.cancel_signals(redis))
        worker_id = store.owner or new_worker_id()
        await _beat(stack, settings, redis, worker_id, toolbox, tools, service.unrecorded)
        yield service


async def _open_saver(stack: AsyncExitStack, settings: Settings, fault: Faults) -> BaseCheckpointSaver[Any]:
    """The checkpointer: where every step of a run is checkpointed."""
    # Every checkpoint write of a run is timed (worker/metrics.py), and traced when tracing is
    # on (shared/tracing.py); a fault, when asked, comes first.
    kill = [fault.checkpoint] if fault.checkpoint is not None else []
    hooks = [*kill, TimedCheckpoints, *tracing.checkpoint_hooks()]
    # One connection per run in flight, and one for a cancel's or a takeover's read (PostgreSQL).
    return await stack.enter_async_context(
        open_checkpointer(settings, size=settings.worker_concurrency + 1, hooks=hooks)
    )


async def _open_tools(stack: AsyncExitStack, settings: Settings) -> McpToolbox:
    """The MCP sessions, open for the worker's life."""
    variables = {
        **os.environ, "MEMORY_FILE_PATH": str(settings.memory_file_path), "PYTHON": sys.executable,
    }
    settings.memory_file_path.parent.mkdir(parents=True, exist_ok=True)
    toolbox = McpToolbox.from_config(
        load_config(settings.mcp_config_path, variables),
        start_timeout=settings.mcp_start_timeout, call_timeout=settings.mcp_call_timeout,
        repeat=load_repeat(settings.mcp_config_path), approvals=load_approvals(settings.mcp_config_path),
    )
    stack.push_async_callback(toolbox.close)
    await toolbox.open()
    return toolbox


def _agent(
    settings: Settings, redis: Redis, store: RunStore, saver: BaseCheckpointSaver[Any],
    tools: Callable[[], Sequence[BaseTool]], needs_approval: Callable[[str], bool], items: BaseStore,
    fault: Faults,
) -> tuple[CompiledStateGraph[Any, Any, Any, Any], Ledger]:
    """The agent's graph, and the ledger where each of its tool calls is recorded."""
    # The application tables' connection, not the saver's (worker/store.py says why).
    ledger = Ledger(store.db, after_outcome=fault.after_outcome, hold=fault.hold)
    graph = build_graph(
        model=build_model(settings),
        tools=tools,
        system_prompt=read_system_prompt(settings.system_prompt_path),
        checkpointer=saver,
        needs_approval=needs_approval,
        ledger=ledger,
        model_calls=ModelCalls(redis),
        models=lambda name: build_model(settings, name),
        store=items,
        snapshot_frequency=settings.messages_snapshot_every,
    )
    return graph, ledger


async def _recover_and_watch(
    stack: AsyncExitStack, settings: Settings, redis: Redis, service: RunService,
    saver: BaseCheckpointSaver[Any],
) -> int:
    """End what a dead worker left (worker/run/lifetime/recovery.py), then start the loops that keep
    watching: the sweep (with the approval deadlines, the retention, the threads' expiry and the
    checkpoint pruning), the crons' ticker and, on PostgreSQL, the leases. How many runs were
    recovered."""
    store, ending = service.store, service.ending
    also: list[Callable[[], Awaitable[object]]] = []
    if settings.approval_timeout is not None:
        also.append(ApprovalDeadlines(store.db, service.graph, redis, settings.approval_timeout).once)
    if settings.conversation_retention_days is not None:
        also.append(Retention(store.db, redis, settings.conversation_retention_days).once)
    if settings.checkpoint_prune == "latest":
        also.append(Pruning(store.db, saver, redis).once)
    also.append(ThreadExpiry(store.db, redis).once)
    sweep = ClaimSweep(
        redis, store,
        executing=lambda: set(service.live), event_retention=settings.event_retention, also=also,
    )
    recovered = await recover(redis, store, ending, saver, sweep)
    # Stopped before the store closes (the stack unwinds in reverse).
    sweep.start()
    stack.push_async_callback(sweep.stop)
    ticker = CronTicker(store.db, redis)
    ticker.start()
    stack.push_async_callback(ticker.stop)
    if store.db.leases:
        leases = Leases(store, service.live, functools.partial(reconcile, redis, store, ending, saver))
        leases.start()
        stack.push_async_callback(leases.stop)
    return recovered


async def _beat(
    stack: AsyncExitStack, settings: Settings, redis: Redis, worker_id: str, toolbox: McpToolbox,
    tools: Callable[[], Sequence[BaseTool]], unrecorded: UnrecordedOutcomes,
) -> None:
    """Beat for the worker's life, and stop beating (our keys gone) when it closes.

    ``worker_id``: the lease owner on PostgreSQL; on SQLite (one worker) an id made the same way.
    """
    # Beats go over a connection of their own, named, so readers see at once that this process
    # is gone (shared/redis/liveness.py): Redis drops it when the process dies.
    beating = Redis.from_url(
        settings.redis_url, client_name=connection_name(worker_id), **connection_kwargs()
    )
    stack.push_async_callback(beating.aclose)
    beat = asyncio.create_task(
        _heartbeat(
            beating, worker_id, time.time(), settings, toolbox.status, tools,
            lambda: len(unrecorded),
        ),
        name="heartbeat",
    )

    async def stop_beating() -> None:
        beat.cancel()
        with suppress(asyncio.CancelledError):
            await beat  # no beat of ours may land after the keys are gone
        with suppress(RedisError):
            # Only our own heartbeat: the other workers stay alive to every reader.
            await scripts(redis).stop_beating(
                keys=[worker_heartbeat_key(worker_id), WORKERS, WORKER_HEARTBEAT],
                args=[worker_id, worker_heartbeat_key("")],
            )

    stack.push_async_callback(stop_beating)
