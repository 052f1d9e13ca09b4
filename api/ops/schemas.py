"""Bodies of the operations' routes: the agent, health and readiness.

JSON field names are camelCase except in the JSON Lines export, whose lines keep
the checkpointer's own snake_case names. Optional fields are left out, not null.
"""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType

from api.http.schemas import ErrorDetail
from api.runs.schemas import WorkerInfo


class AgentTool(msgspec.Struct):
    """A tool the agent can call: ``server__tool`` and the first line of what it does."""

    name: str
    description: str


class AgentInfo(msgspec.Struct, rename="camel"):
    """What answers: the model and the tools, as the newest live worker's heartbeat says (else
    the last beat seen; the model from this process's OLLAMA_MODEL when no worker ever beat)."""

    model: str
    tools: list[AgentTool]
    worker_alive: bool


class Health(msgspec.Struct):
    status: Literal["ok"] = "ok"


class ReadinessChecks(msgspec.Struct):
    redis: bool
    database: bool
    worker: bool
    model: bool
    #: each MCP server of the live worker: "up", or why it is not. A server that is down
    #: costs only its own tools (they answer the model with an error), so it is named
    #: here but does not make the service unready.
    tool_servers: dict[str, str] = msgspec.field(default_factory=dict, name="toolServers")

    def missing(self) -> list[str]:
        return [name for name in ("redis", "database", "worker", "model") if not getattr(self, name)]


class Ready(msgspec.Struct):
    status: Literal["ready"]
    checks: ReadinessChecks
    #: the worker's heartbeat: alive, since when (absent when Redis cannot be asked)
    worker: WorkerInfo | UnsetType = UNSET


class NotReadyBody(msgspec.Struct):
    error: ErrorDetail
    checks: ReadinessChecks
    worker: WorkerInfo | UnsetType = UNSET
