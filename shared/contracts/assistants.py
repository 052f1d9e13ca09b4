"""Assistants (the Agent Protocol's ``client.assistants``): stored configurations of the one agent.

An assistant says, in its ``context`` (or its ``config.configurable``; the context wins), what
the agent is for its runs (:data:`FIELDS`): ``system_prompt`` (instead of config/system.md),
``model`` (an Ollama model instead of ``OLLAMA_MODEL``), ``tools`` (the tool servers and tools it
may use: ``server`` for every tool of a server, ``server__tool`` for one; unset: all of them),
``require_approval`` (the tools that wait for a decision before they run, named the same way,
besides those mcp.json's ``requireApproval`` names: an assistant adds approvals, never lifts
them) and ``configurable`` (which of ``system_prompt``, ``model`` and ``tools`` a run's own
``context`` may override; unset: :data:`OVERRIDABLE_BY_DEFAULT`).

What both ends need: the API resolves a run's :class:`AgentConfig` (the assistant's latest
version with the run's overrides: :func:`resolve`) and puts it on the run's job
(shared/contracts/jobs.py ``RunJob.agent``); the worker gives it to the graph
(:data:`CONFIG_KEY` in the run's ``configurable``) and records it on the run's checkpoints, so a
resume continues with the configuration the run had. The API never writes the database: an
assistant is written by a worker through an ``assistant_write`` job (worker/upkeep/assistants.py)
and read back by the API (api/protocol/assistants/service.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.contracts.codec import decode
from shared.errors import BadRequest

#: the arq function that writes assistants (worker/upkeep/assistants.py)
ASSISTANT_WRITE_FUNCTION = "assistant_write"
#: the key of a run's configurable (and of its checkpoints' metadata) holding its AgentConfig
CONFIG_KEY = "sophos_agent"
#: what an assistant's context may say
FIELDS = ("system_prompt", "model", "tools", "require_approval", "configurable")
#: what a run may override, the assistant may allow
OVERRIDABLE = ("system_prompt", "model", "tools")
OVERRIDABLE_BY_DEFAULT = ("system_prompt", "model")
SYSTEM_PROMPT_MAX_CHARS = 50_000
NAME_MAX_CHARS = 200


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """The agent as one run sees it: None (or absent) fields are the worker's own (config/)."""

    assistant_id: str
    version: int
    system_prompt: str | None = None
    model: str | None = None
    #: the tools it may use (``server`` or ``server__tool``); None: every tool
    tools: tuple[str, ...] | None = None
    #: tools that need approval besides mcp.json's
    require_approval: tuple[str, ...] = ()

    def allows(self, tool: str) -> bool:
        return self.tools is None or _names(tool, self.tools)

    def requires(self, tool: str) -> bool:
        return _names(tool, self.require_approval)


def _names(tool: str, names: tuple[str, ...]) -> bool:
    """Is ``tool`` (``server__tool``, as the model sees it) named by ``names`` (servers or tools)?"""
    server, sep, _ = tool.partition("__")
    return tool in names or (bool(sep) and server in names)


def agent_in(config: Mapping[str, Any] | None) -> AgentConfig | None:
    """The run's AgentConfig from a LangGraph config (its ``configurable``), if it has one."""
    raw = ((config or {}).get("configurable") or {}).get(CONFIG_KEY)
    if isinstance(raw, AgentConfig):
        return raw
    return decode(AgentConfig, raw) if isinstance(raw, Mapping) else None


# --- what an assistant and a run may say ------------------------------------------


def _tool_names(name: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(t, str) and t.strip() for t in value):
        raise BadRequest(f"{name} must be a list of tool servers or tools (server__tool)")
    return tuple(t.strip() for t in value)


def settings_of(config: Mapping[str, Any] | None, context: Mapping[str, Any] | None, *, where: str
                ) -> dict[str, Any]:
    """What ``config.configurable`` and ``context`` say (the context wins), checked: BadRequest
    naming the first field that is wrong. ``where``: whose they are, for the message."""
    config = config or {}
    if not isinstance(config, Mapping) or not isinstance(context or {}, Mapping):
        raise BadRequest(f"{where}'s config and context must be objects")
    other = sorted(set(config) - {"configurable"})
    if other:
        raise BadRequest(
            f"{where}'s config.{other[0]} is not served by Sophos: config takes configurable only"
            " (docs/agent-protocol.md)"
        )
    configurable = config.get("configurable") or {}
    if not isinstance(configurable, Mapping):
        raise BadRequest(f"{where}'s config.configurable must be an object")
    said = {**configurable, **(context or {})}
    unknown = sorted(set(said) - set(FIELDS))
    if unknown:
        raise BadRequest(
            f"{where} says {unknown[0]!r}, which the agent does not take: it takes {', '.join(FIELDS)}"
        )
    prompt = said.get("system_prompt")
    if prompt is not None and (not isinstance(prompt, str) or len(prompt) > SYSTEM_PROMPT_MAX_CHARS):
        raise BadRequest(f"system_prompt must be text of at most {SYSTEM_PROMPT_MAX_CHARS} characters")
    model = said.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip() or len(model) > NAME_MAX_CHARS):
        raise BadRequest(f"model must be an Ollama model's name (at most {NAME_MAX_CHARS} characters)")
    checked: dict[str, Any] = {k: v for k, v in said.items() if v is not None}
    for name in ("tools", "require_approval"):
        if name in checked:
            checked[name] = list(_tool_names(name, checked[name]))
    if "configurable" in checked:
        allowed = checked["configurable"]
        if not isinstance(allowed, list) or not set(allowed) <= set(OVERRIDABLE):
            raise BadRequest(f"configurable must list some of {', '.join(OVERRIDABLE)}")
    return checked


def resolve(assistant_id: str, version: int, stored: Mapping[str, Any], overrides: Mapping[str, Any]
            ) -> AgentConfig:
    """The AgentConfig of a run of the assistant: what it stored (checked by :func:`settings_of`),
    with the run's ``overrides`` of the fields it marks configurable (any other: BadRequest)."""
    allowed = stored.get("configurable", OVERRIDABLE_BY_DEFAULT)
    refused = sorted(k for k in overrides if k not in allowed)
    if refused:
        raise BadRequest(
            f"a run may not set {refused[0]!r}: the assistant lets a run override "
            f"{', '.join(allowed) or 'nothing'} (its context's configurable)"
        )
    said = {**stored, **overrides}
    tools = said.get("tools")
    return AgentConfig(
        assistant_id, version, said.get("system_prompt"), said.get("model"),
        None if tools is None else tuple(tools), tuple(said.get("require_approval") or ()),
    )


# --- the job the API enqueues -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class AssistantWrite:
    """Write an assistant (``assistant_write``). ``op``: ``create`` (version 1), ``update`` (a new
    version: the fields given replace the latest's, ``metadata`` is merged into it), ``latest``
    (make ``version`` the latest) or ``delete``. Safe twice: a create of an id stored, an update
    whose version was stored (its ``job_id`` is kept with it) and a delete of what is gone do
    nothing."""

    op: str
    assistant_id: str
    job_id: str
    at: float
    owner: str = "local"
    graph_id: str | None = None
    name: str | None = None
    description: str | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    version: int | None = None


def assistant_done_key(job_id: str) -> str:
    """List the worker pushes an assistant job's outcome to (``done``, ``missing`` or
    ``failed: ...``), briefly kept."""
    return f"sophos:assistant-done:{job_id}"


# --- the stored assistant ---------------------------------------------------------

#: an assistant's version, with its owner and latest version (``assistants`` joined with
#: ``assistant_versions``, aliased ``a`` and ``v``)
ASSISTANT_COLUMNS = (
    "v.id, v.version, v.graph_id, v.name, v.description, v.config, v.context, v.metadata,"
    " v.created_at, a.created_at, a.updated_at, a.owner, a.latest"
)


@dataclass(frozen=True, slots=True)
class AssistantRow:
    id: str
    version: int
    graph_id: str
    name: str
    description: str | None
    config: dict[str, Any]
    context: dict[str, Any]
    metadata: dict[str, Any]
    version_created_at: str
    created_at: str
    updated_at: str
    owner: str
    latest: int

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> AssistantRow:
        return cls(
            str(row[0]), int(row[1]), str(row[2]), str(row[3]), row[4], json.loads(row[5]),
            json.loads(row[6]), json.loads(row[7]), str(row[8]), str(row[9]), str(row[10]), str(row[11]),
            int(row[12]),
        )
