"""How ``mcp.json`` says to reach each tool server: a command (stdio) or a URL (remote).

``{"mcpServers": {name: spec}}``, each spec one of

- ``{"command", "args", "env", "cwd"}``: a child process speaking MCP over stdio;
- ``{"url", "headers", "transport"}``: a remote server over Streamable HTTP, or over the older
  HTTP+SSE transport with ``"transport": "sse"``.

``${VAR}`` in a command, its args, env and cwd, a URL and header values is taken from the
environment. A variable that is not set is an error at start-up naming it (and the server), never
an empty string sent as a token. The values put into a remote server's URL and headers are its
*secrets*: :class:`Secrets` takes them out of every text the worker writes about that server
(its status, log events, the errors the model and the page get), since an HTTP library's error
may quote the URL, and a server's own error may quote what it received.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.tools.policy import McpConfigError

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

#: the transports of a remote server (``"transport"``); the first is the default
REMOTE_TRANSPORTS = ("streamable_http", "sse")
#: what stands in a text for a secret taken out of it
REDACTED = "[redacted]"


@dataclass(frozen=True, slots=True)
class Secrets:
    """The values ``${VAR}`` put into a remote server's URL and headers."""

    values: tuple[str, ...] = ()

    def redact(self, text: str) -> str:
        """``text`` with every secret replaced by :data:`REDACTED` (longest first)."""
        for value in sorted(self.values, key=len, reverse=True):
            text = text.replace(value, REDACTED)
        return text


class _Expander:
    """``${VAR}`` expansion for one server, remembering the values it put in."""

    def __init__(self, path: Path, server: str, variables: Mapping[str, str]) -> None:
        self.path, self.server, self.variables = path, server, variables
        self.used: list[str] = []

    def __call__(self, value: Any) -> str:
        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in self.variables:
                raise McpConfigError(
                    f"{self.path}: server {self.server!r} uses ${{{name}}}, and {name} is not set in the"
                    " environment"
                )
            self.used.append(self.variables[name])
            return self.variables[name]

        return _VAR.sub(one, str(value))


def load_config(path: Path, variables: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Read ``mcp.json``: each server's connection (``transport`` says which), ``${VAR}`` expanded
    from ``variables``. A remote one carries its ``secrets`` (:class:`Secrets`)."""
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text())
        servers = raw["mcpServers"]
    except (ValueError, KeyError, TypeError) as exc:
        raise McpConfigError(f"{path}: expected {{\"mcpServers\": {{...}}}} ({exc})") from exc

    config: dict[str, dict[str, Any]] = {}
    for name, spec in servers.items():
        if "__" in name or not isinstance(spec, dict) or ("command" in spec) == ("url" in spec):
            raise McpConfigError(
                f"{path}: server {name!r} needs a command or a url (one of them) and a name without '__'"
            )
        expand = _Expander(path, name, variables)
        config[name] = _remote(path, name, spec, expand) if "url" in spec else _stdio(spec, expand)
    return config


def _stdio(spec: dict[str, Any], expand: _Expander) -> dict[str, Any]:
    connection: dict[str, Any] = {
        "transport": "stdio",
        "command": expand(spec["command"]),
        "args": [expand(a) for a in spec.get("args", [])],
        "env": {k: expand(v) for k, v in spec.get("env", {}).items()} or None,
    }
    if spec.get("cwd"):
        connection["cwd"] = expand(spec["cwd"])
    return connection


def _remote(path: Path, name: str, spec: dict[str, Any], expand: _Expander) -> dict[str, Any]:
    transport = spec.get("transport", REMOTE_TRANSPORTS[0])
    if transport == "http":  # what other clients call it
        transport = REMOTE_TRANSPORTS[0]
    headers = spec.get("headers", {})
    if transport not in REMOTE_TRANSPORTS or not isinstance(headers, dict):
        raise McpConfigError(
            f"{path}: server {name!r}: transport must be one of {', '.join(REMOTE_TRANSPORTS)} and headers"
            " an object"
        )
    url = expand(spec["url"])
    if not url.startswith(("http://", "https://")):
        raise McpConfigError(f"{path}: server {name!r}: url must start with http:// or https://")
    expanded = {str(k): expand(v) for k, v in headers.items()}
    return {"transport": transport, "url": url, "headers": expanded,
            "secrets": Secrets(tuple(v for v in expand.used if v))}


def secrets_of(connection: Mapping[str, Any]) -> Secrets:
    """A connection's secrets (none for a stdio server)."""
    secrets = connection.get("secrets")
    return secrets if isinstance(secrets, Secrets) else Secrets()
