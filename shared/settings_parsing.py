"""How one variable of the environment becomes a setting's value (shared/settings.py).

Each reader takes the environment and a variable's name, returns the value (or the default when
the variable is unset or empty) and raises :class:`SettingsError` naming the variable when its
value cannot be used.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse, urlsplit

from shared.redaction import redact_url


class SettingsError(ValueError):
    """A variable of the environment has a value the service cannot use."""

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"{variable}: {problem}")
        self.variable = variable


def integer(env: Mapping[str, str], name: str, default: int, *, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(name, f"expected an integer, got {raw!r}") from None
    if value < minimum:
        raise SettingsError(name, f"must be at least {minimum}, got {value}")
    return value


def number(env: Mapping[str, str], name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(name, f"expected a number, got {raw!r}") from None
    if value < minimum:
        raise SettingsError(name, f"must be at least {minimum}, got {value}")
    return value


def optional_seconds(env: Mapping[str, str], name: str) -> float | None:
    return optional_positive(env, name, "seconds")


def optional_positive(env: Mapping[str, str], name: str, unit: str) -> float | None:
    """A positive, finite number (of ``unit``), or None when unset or empty."""
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    value = number(env, name, 0.0)
    if not math.isfinite(value) or value <= 0:
        raise SettingsError(name, f"expected a positive number of {unit} (or unset), got {raw!r}")
    return value


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def boolean(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise SettingsError(name, f"expected true or false, got {raw!r}")


def optional_bool(env: Mapping[str, str], name: str) -> bool | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    return boolean(env, name, False)


def url(env: Mapping[str, str], name: str, default: str, schemes: tuple[str, ...]) -> str:
    raw = env.get(name) or default
    parsed = urlparse(raw)
    if parsed.scheme not in schemes or not parsed.hostname:
        raise SettingsError(name, f"expected a {'/'.join(schemes)} URL, got {redact_url(raw)!r}")
    try:
        parsed.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise SettingsError(name, f"bad port in {redact_url(raw)!r}") from None
    return raw.rstrip("/")


def database_url(env: Mapping[str, str], name: str) -> str | None:
    """A PostgreSQL URL, or None (unset or empty: the SQLite file)."""
    raw = env.get(name) or ""
    if not raw:
        return None
    parsed = urlparse(raw)
    if parsed.scheme not in ("postgresql", "postgres"):
        got = parsed.scheme or redact_url(raw)
        raise SettingsError(name, f"expected a postgresql:// URL (or nothing, for SQLite), got {got!r}")
    try:
        parsed.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise SettingsError(name, "bad port in the URL") from None
    if not parsed.path.strip("/"):
        raise SettingsError(name, "names no database (postgresql://user@host:5432/DATABASE)")
    return raw


def choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = env.get(name) or default
    if raw not in choices:
        raise SettingsError(name, f"expected one of {', '.join(choices)}, got {raw!r}")
    return raw


#: where a test can hold a tool call (tests/support/fault_hooks.py ``hold_call``)
HOLD_POINTS = ("before_intent", "after_intent", "before_task_state", "before_outcome")


def hold_call(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(name) or None
    if raw is not None:
        point, _, tool = raw.partition(":")
        if point not in HOLD_POINTS or not tool:
            raise SettingsError(
                name, f"expected POINT:TOOL, POINT one of {', '.join(HOLD_POINTS)}, got {raw!r}"
            )
    return raw


def addresses(env: Mapping[str, str], name: str, default: str) -> str:
    """A comma-separated list of IP addresses and networks, or ``*``."""
    raw = env.get(name) or default
    for item in (part.strip() for part in raw.split(",")):
        if item == "*" and raw.strip() == "*":
            continue
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            raise SettingsError(name, f"expected IP addresses or networks (or *), got {item!r}") from None
    return raw


_DEFAULT_PORTS = {"http": 80, "https": 443}
_HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")


def origins(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """A comma-separated list of web origins (``scheme://host[:port]``), as browsers send them.

    Each is normalized to the form of an ``Origin`` header (lower case, no default port,
    no trailing slash), which is compared as an exact string.
    """
    origins: list[str] = []
    for item in (part.strip() for part in (env.get(name) or "").split(",")):
        if not item:
            continue
        problem = f"expected origins like https://app.example.com[:port], got {item!r}"
        try:
            parsed = urlsplit(item)
            port = parsed.port
        except ValueError:
            raise SettingsError(name, problem) from None
        host = parsed.hostname or ""
        if (
            parsed.scheme not in _DEFAULT_PORTS
            or parsed.path not in ("", "/")
            or parsed.query or parsed.fragment or parsed.username is not None or parsed.password is not None
            or not (_HOST_NAME.fullmatch(host) or _is_ip(host))
        ):
            raise SettingsError(name, problem)
        shown = f"[{host}]" if ":" in host else host
        if port is not None and port != _DEFAULT_PORTS[parsed.scheme]:
            shown = f"{shown}:{port}"
        origin = f"{parsed.scheme}://{shown}"
        if origin not in origins:
            origins.append(origin)
    return tuple(origins)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def optional_port(env: Mapping[str, str], name: str) -> int | None:
    """A TCP port, or None when unset or empty."""
    raw = env.get(name) or ""
    if not raw:
        return None
    if not (raw.isdigit() and 0 < int(raw) < 65536):
        raise SettingsError(name, f"expected a TCP port, got {raw!r}")
    return int(raw)


def path(env: Mapping[str, str], name: str, default: str) -> Path:
    raw = env.get(name) or default
    if "\x00" in raw:
        raise SettingsError(name, "contains a NUL byte")
    return Path(raw).expanduser().absolute()


def otlp_traces(env: Mapping[str, str]) -> bool:
    """Whether the standard OpenTelemetry variables ask for traces over OTLP."""
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not endpoint:
        return False
    if boolean(env, "OTEL_SDK_DISABLED", False):
        return False
    exporters = (env.get("OTEL_TRACES_EXPORTER") or "otlp").lower()
    return "otlp" in {e.strip() for e in exporters.split(",")}



#: a user's name: what keys are made for and what owns resources (shared/users.py)
USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@|:+-]{0,127}")


def user_name(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(name)
    if not raw:
        return None
    if not USER_NAME.fullmatch(raw):
        raise SettingsError(name, f"not a user name (letters, digits and ._@|:+-, at most 128): {raw!r}")
    return raw


@dataclass(frozen=True)
class Oidc:
    issuer: str | None
    audience: str | None
    user_claim: str
    operator_claim: str | None
    operator_value: str | None
    page_client: str | None


def oidc(env: Mapping[str, str]) -> Oidc:
    """AUTH_OIDC_*: the issuer (https, or http on loopback for tests) and its audience together."""
    issuer = env.get("AUTH_OIDC_ISSUER") or None
    audience = env.get("AUTH_OIDC_AUDIENCE") or None
    claim = env.get("AUTH_OIDC_OPERATOR_CLAIM") or None
    value = env.get("AUTH_OIDC_OPERATOR_VALUE") or None
    if issuer is not None:
        parts = urlsplit(issuer)
        loopback = parts.hostname in ("localhost", "127.0.0.1", "::1")
        if parts.scheme != "https" and not (parts.scheme == "http" and loopback):
            raise SettingsError(
                "AUTH_OIDC_ISSUER", f"must be an https URL (http only on loopback): {issuer!r}"
            )
        if audience is None:
            raise SettingsError("AUTH_OIDC_AUDIENCE", "must be set with AUTH_OIDC_ISSUER: the audience "
                                "(client id) its tokens must name")
    if (claim is None) != (value is None):
        raise SettingsError("AUTH_OIDC_OPERATOR_VALUE" if value is None else "AUTH_OIDC_OPERATOR_CLAIM",
                            "AUTH_OIDC_OPERATOR_CLAIM and AUTH_OIDC_OPERATOR_VALUE go together")
    page_client = env.get("AUTH_OIDC_PAGE_CLIENT") or None
    if page_client is not None and issuer is None:
        raise SettingsError("AUTH_OIDC_PAGE_CLIENT", "the page signs in through AUTH_OIDC_ISSUER: set it too")
    return Oidc(issuer.rstrip("/") if issuer else None, audience,
                 env.get("AUTH_OIDC_USER_CLAIM") or "sub", claim, value, page_client)

