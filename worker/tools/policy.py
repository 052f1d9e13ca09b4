"""What ``mcp.json`` and the tools themselves say about tools beyond how to reach their servers.

- ``requireApproval`` (per server): ``true`` or ``false`` for every tool of the server, a list of
  its tool names that ask, or an object ``{"tool": true|false}`` tool by tool. A call of such a
  tool waits for the user's decision before it runs (worker/agent/graph.py, the approval step).
  Where the configuration says nothing of a tool, the tool's own MCP annotations decide: one that
  says it is destructive (``destructiveHint`` true, ``readOnlyHint`` not true) asks; one that
  says nothing does not (MCP's own default for a missing hint is "destructive", which would make
  every tool of most servers ask: only a tool's word counts here).
- ``safeToRepeat`` (per server): whether a call that *may* have run (the worker stopped while
  it was being made, or its answer did not come: worker/tools/ledger/) may be sent again
  without asking. By default the tool's own MCP annotations decide (``readOnlyHint`` or
  ``idempotentHint`` true: safe); ``true`` or ``false`` overrides that for every tool of the
  server, a list names the tools that are safe, and an object ``{"tool": true|false}`` overrides
  tool by tool.

Tool names in both are without the ``server__`` prefix the model sees.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.tools import BaseTool

#: a wrapped MCP tool's ``metadata`` key: its calls may be sent again after a crash (bool)
SAFE_TO_REPEAT = "sophos_safe_to_repeat"
#: a wrapped MCP tool's ``metadata`` key: its calls wait for the user's approval (bool)
NEEDS_APPROVAL = "sophos_needs_approval"


class McpConfigError(ValueError):
    pass


def _servers(path: Path) -> dict[str, Any]:
    """The ``mcpServers`` of ``mcp.json`` (read after worker/tools/mcp.py's ``load_config`` accepted it)."""
    return dict(json.loads(path.read_text())["mcpServers"]) if path.exists() else {}


@dataclass(frozen=True, slots=True)
class ApprovalPolicy:
    """Which tools' calls wait for the user's approval (``requireApproval``, else the tool's hints)."""

    #: server → every tool of it does (True) or does not (False) ask
    servers: Mapping[str, bool] = field(default_factory=dict)
    #: ``server__tool`` → that tool does or does not ask
    tools: Mapping[str, bool] = field(default_factory=dict)

    def for_tool(self, server: str, tool: str, *, destructive: bool) -> bool:
        """``destructive``: the tool's MCP annotations say so (``destructiveHint`` true, not read-only)."""
        full = f"{server}__{tool}"
        if full in self.tools:
            return self.tools[full]
        return self.servers.get(server, destructive)

    def __call__(self, tool: str) -> bool:
        """By the model's name of a tool alone (``server__tool``), its hints unknown: what is configured."""
        server, sep, name = tool.partition("__")
        return bool(sep) and self.for_tool(server, name, destructive=False)


def load_approvals(path: Path) -> ApprovalPolicy:
    servers: dict[str, bool] = {}
    tools: dict[str, bool] = {}
    for name, spec in _servers(path).items():
        required = spec.get("requireApproval")
        if required is None:
            continue
        if isinstance(required, bool):
            servers[name] = required
        elif isinstance(required, list) and all(isinstance(t, str) and t for t in required):
            tools.update((f"{name}__{t}", True) for t in required)
        elif isinstance(required, dict) and all(isinstance(v, bool) for v in required.values()):
            tools.update((f"{name}__{t}", v) for t, v in required.items())
        else:
            raise McpConfigError(
                f"{path}: server {name!r}: requireApproval must be true, false, a list of tool names"
                " or an object of tool names to true or false"
            )
    return ApprovalPolicy(servers, tools)


@dataclass(frozen=True, slots=True)
class RepeatPolicy:
    """Which tools' uncertain calls are sent again without asking (``safeToRepeat``)."""

    #: server → every tool of it is (True) or is not (False) safe to repeat
    servers: Mapping[str, bool] = field(default_factory=dict)
    #: ``server__tool`` → that tool is or is not safe to repeat
    tools: Mapping[str, bool] = field(default_factory=dict)

    def __call__(self, server: str, tool: str, *, hinted: bool) -> bool:
        """``hinted``: the tool's MCP annotations say it is read-only or idempotent."""
        full = f"{server}__{tool}"
        if full in self.tools:
            return self.tools[full]
        return self.servers.get(server, hinted)


def load_repeat(path: Path) -> RepeatPolicy:
    servers: dict[str, bool] = {}
    tools: dict[str, bool] = {}
    for name, spec in _servers(path).items():
        value = spec.get("safeToRepeat")
        if value is None:
            continue
        if isinstance(value, bool):
            servers[name] = value
        elif isinstance(value, list) and all(isinstance(t, str) and t for t in value):
            tools.update((f"{name}__{t}", True) for t in value)
        elif isinstance(value, dict) and all(isinstance(v, bool) for v in value.values()):
            tools.update((f"{name}__{t}", v) for t, v in value.items())
        else:
            raise McpConfigError(
                f"{path}: server {name!r}: safeToRepeat must be true, false, a list of tool names"
                " or an object of tool names to true or false"
            )
    return RepeatPolicy(servers, tools)


def needs_approval(tool: BaseTool) -> bool:
    """Whether a call of ``tool`` waits for the user's approval (False unless said)."""
    return bool((tool.metadata or {}).get(NEEDS_APPROVAL, False))


def safe_to_repeat(tool: BaseTool) -> bool:
    """Whether an uncertain call of ``tool`` may be sent again without asking (False unless said)."""
    return bool((tool.metadata or {}).get(SAFE_TO_REPEAT, False))
