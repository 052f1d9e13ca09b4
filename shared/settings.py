"""Typed settings, read once from the environment by each entry point.

Nothing here reads ``os.environ`` at import time: a process calls
:meth:`Settings.from_env` in its entry point and passes the result down.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse, urlsplit

_PASSWORD_PARAM = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` as it may be shown (logs, messages, answers): its password replaced by ``***``.

    The password of the userinfo (``scheme://user:PASSWORD@host``) and a ``password``
    query parameter (redis-py reads one) are hidden. A malformed URL is handled too: the
    userinfo runs to the last ``@``, so a password with an unencoded ``/``, ``?`` or ``#``
    is hidden whole (at worst a path holding an ``@`` shows less than it could).
    """
    scheme, sep, rest = url.partition("://")
    if not sep:  # no scheme (a mistake): the password is hidden all the same
        scheme, rest = "", url
    userinfo, at, tail = rest.rpartition("@")
    if at and ":" in userinfo:
        rest = f"{userinfo.partition(':')[0]}:***@{tail}"
    return _PASSWORD_PARAM.sub(r"\1***", f"{scheme}{sep}{rest}")


class SettingsError(ValueError):
    """A variable of the environment has a value the service cannot use."""

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"{variable}: {problem}")
        self.variable = variable


def _int(env: Mapping[str, str], name: str, default: int, *, minimum: int = 0) -> int:
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


def _float(env: Mapping[str, str], name: str, default: float, *, minimum: float = 0.0) -> float:
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


def _optional_seconds(env: Mapping[str, str], name: str) -> float | None:
    return _optional_positive(env, name, "seconds")


def _optional_positive(env: Mapping[str, str], name: str, unit: str) -> float | None:
    """A positive, finite number (of ``unit``), or None when unset or empty."""
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    value = _float(env, name, 0.0)
    if not math.isfinite(value) or value <= 0:
        raise SettingsError(name, f"expected a positive number of {unit} (or unset), got {raw!r}")
    return value


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise SettingsError(name, f"expected true or false, got {raw!r}")


def _optional_bool(env: Mapping[str, str], name: str) -> bool | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    return _bool(env, name, False)


def _url(env: Mapping[str, str], name: str, default: str, schemes: tuple[str, ...]) -> str:
    raw = env.get(name) or default
    parsed = urlparse(raw)
    if parsed.scheme not in schemes or not parsed.hostname:
        raise SettingsError(name, f"expected a {'/'.join(schemes)} URL, got {redact_url(raw)!r}")
    try:
        parsed.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise SettingsError(name, f"bad port in {redact_url(raw)!r}") from None
    return raw.rstrip("/")


def _database_url(env: Mapping[str, str], name: str) -> str | None:
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


def _choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = env.get(name) or default
    if raw not in choices:
        raise SettingsError(name, f"expected one of {', '.join(choices)}, got {raw!r}")
    return raw


#: where a test can hold a tool call (tests/support/fault_hooks.py ``hold_call``)
HOLD_POINTS = ("before_intent", "after_intent", "before_outcome")


def _hold_call(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(name) or None
    if raw is not None:
        point, _, tool = raw.partition(":")
        if point not in HOLD_POINTS or not tool:
            raise SettingsError(
                name, f"expected POINT:TOOL, POINT one of {', '.join(HOLD_POINTS)}, got {raw!r}"
            )
    return raw


def _addresses(env: Mapping[str, str], name: str, default: str) -> str:
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


def _origins(env: Mapping[str, str], name: str) -> tuple[str, ...]:
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


def _optional_port(env: Mapping[str, str], name: str) -> int | None:
    """A TCP port, or None when unset or empty."""
    raw = env.get(name) or ""
    if not raw:
        return None
    if not (raw.isdigit() and 0 < int(raw) < 65536):
        raise SettingsError(name, f"expected a TCP port, got {raw!r}")
    return int(raw)


def _path(env: Mapping[str, str], name: str, default: str) -> Path:
    raw = env.get(name) or default
    if "\x00" in raw:
        raise SettingsError(name, "contains a NUL byte")
    return Path(raw).expanduser().absolute()


def _otlp_traces(env: Mapping[str, str]) -> bool:
    """Whether the standard OpenTelemetry variables ask for traces over OTLP."""
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not endpoint:
        return False
    if _bool(env, "OTEL_SDK_DISABLED", False):
        return False
    exporters = (env.get("OTEL_TRACES_EXPORTER") or "otlp").lower()
    return "otlp" in {e.strip() for e in exporters.split(",")}


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a Sophos process can be configured with."""

    database_path: Path = Path("data/db/sophos.db")
    # The Store's items on SQLite (shared/storage/memory.py): written by every API process and the
    # worker, so apart from the database, which only the worker writes. None: beside the database.
    store_path: Path | None = None
    # postgresql://…: all state in PostgreSQL instead of the SQLite file at database_path,
    # and any number of workers (shared/storage). None: SQLite, one worker.
    database_url: str | None = None
    # Seconds a worker's lease on a run it executes lasts unless renewed (PostgreSQL only):
    # a run whose lease lapsed is marked interrupted by any live worker (worker/run/leases.py).
    run_lease_seconds: float = 30.0
    redis_url: str = "redis://127.0.0.1:6379/0"
    ollama_host: str = "http://localhost:11434"
    ollama_model: str = "qwen3"
    ollama_think: bool | None = None
    config_dir: Path = Path("config")
    memory_file_path: Path = Path("data/memory/memory.jsonl")
    agent_recursion_limit: int = 25
    shutdown_timeout: float = 30.0
    # Runs of different conversations one worker executes at once (worker/__main__.py).
    worker_concurrency: int = 1
    # Seconds a tool call may wait for the user's decision before it is rejected by itself
    # (worker/schedule/deadlines.py); None: wait for ever.
    approval_timeout: float | None = None
    # Days a conversation may stay idle before the worker deletes it (worker/upkeep/retention.py);
    # None: keep for ever.
    conversation_retention_days: float | None = None
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    api_token: str | None = None
    # Serve without API_TOKEN on an address beyond loopback (api/auth/bearer.py refuses otherwise).
    allow_unauthenticated: bool = False
    # Peers whose X-Forwarded-For names the client (uvicorn's forwarded_allow_ips): the
    # address that the per-client limits count.
    forwarded_allow_ips: str = "127.0.0.1"
    # Chat submissions (POST /api/chat) per client address per minute, all API
    # processes together (counted in Redis); 0 turns the limit off.
    rate_limit_per_minute: int = 60
    # Open event streams per client address, per API process; 0 turns the limit off.
    max_streams_per_client: int = 32
    # Runs queued or running per user (not operators), counted in Redis by the submit script
    # (shared/redis/scripts.py); the next is 429 with Retry-After. 0 turns the limit off.
    user_max_active_runs: int = 8
    # Identities (api/auth/, docs/security.md): an OpenID Connect issuer whose bearer JWTs are
    # users (its discovery document names the JWKS), the audience its tokens must name, the
    # claim naming the user, and the claim and value that make one an operator.
    auth_oidc_issuer: str | None = None
    auth_oidc_audience: str | None = None
    auth_oidc_user_claim: str = "sub"
    auth_oidc_operator_claim: str | None = None
    auth_oidc_operator_value: str | None = None
    # The page's sign-in through that issuer (authorization code with PKCE, a public client):
    # the client id registered for the page, and the scopes it asks for. Unset: keys only.
    auth_oidc_page_client: str | None = None
    auth_oidc_page_scope: str = "openid profile"
    # Who owns what was stored before identities (an old database upgraded in place); None:
    # the local user.
    auth_adopt_owner: str | None = None
    # Web origins (scheme://host[:port]) whose pages may call the API from a browser: they
    # get CORS headers and pass the browser guard (api/auth/bearer.py). Empty: same origin only.
    cors_origins: tuple[str, ...] = ()
    # Webhooks of Agent Protocol runs (shared/contracts/webhooks.py, worker/schedule/webhooks.py):
    # plain http and loopback, private or link-local destinations are refused unless allowed here.
    webhook_allow_http: bool = False
    webhook_allow_private: bool = False
    # Attempts at delivering one run's webhook; the nth waits WEBHOOK_RETRY_SECONDS * 2**(n-2).
    webhook_attempts: int = 5
    webhook_retry_seconds: float = 2.0
    # Seconds one attempt may take (connecting, sending, the receiver's answer).
    webhook_timeout: float = 10.0
    # json, console, or auto: readable lines on a terminal, JSON lines otherwise.
    log_format: str = "auto"
    log_content: bool = False
    # Events of a finished run stay readable this long (seconds).
    event_retention: int = 3600
    # Newest events kept per run; older ones are trimmed (approximately).
    event_max_per_run: int = 10_000
    max_body_bytes: int = 1024 * 1024
    max_message_chars: int = 32_000
    # Seconds between SSE keep-alive comments.
    sse_ping_interval: float = 15.0
    # Seconds a client may leave sent data unread (its TCP window shut) before the
    # API drops the connection (TCP_USER_TIMEOUT on the API's sockets, Linux).
    sse_client_timeout: float = 30.0
    # The idle worker waits on a wake-up from the submit script; it also looks at the
    # queue at least this often (seconds), in case a wake-up was missed.
    poll_delay: float = 1.0
    mcp_call_timeout: float = 60.0
    mcp_start_timeout: float = 30.0
    model_timeout: float = 300.0
    # Seconds a thread read or export may take in the API's reader processes (api/http/readers.py),
    # waiting for a free reader included; beyond it the read is stopped: 503 READ_TIMEOUT.
    read_timeout: float = 30.0
    # Seconds a reader process may stay idle before it is stopped (~90 MB each, bench figure 15);
    # the next read starts one again (about a second).
    reader_idle_seconds: float = 300.0
    # The fast libraries a process runs on (shared/speedups.py): auto takes the fast one
    # when it is installed. Each measured on and off in bench figure 12: uvloop and hiredis
    # pay (README, Configuration), msgspec did not, so json is the default codec.
    event_loop: str = "auto"  # auto, uvloop or asyncio: the worker's and the API's event loop
    redis_parser: str = "auto"  # auto, hiredis or python: how redis-py parses replies
    json_codec: str = "json"  # auto, msgspec or json: jobs and events (shared/contracts/codec.py)
    api_http: str = "h11"  # auto, httptools or h11: the API's HTTP/1.1 parser (api/http/parser.py)
    # Traces exported over OTLP (shared/tracing.py): on when OTEL_EXPORTER_OTLP_ENDPOINT or
    # OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (and neither OTEL_SDK_DISABLED nor
    # OTEL_TRACES_EXPORTER=none says otherwise); the SDK reads the other OTEL_* variables itself.
    tracing: bool = False
    # The local launcher's own (``./sophos up``, scripts/launch.py; the services ignore them):
    # without REDIS_URL (``own_redis``) it starts a Redis of its own on this port (None: a free
    # one), its AOF in this folder; a child that stayed up ``launch_restart_reset`` seconds has
    # its next restart wait 1 s again.
    own_redis: bool = True
    launch_redis_port: int | None = None
    launch_redis_dir: Path = Path("data/redis")
    launch_restart_reset: float = 60.0
    # Test-only fault hook, off by default: the worker SIGKILLs itself right after
    # its Nth checkpoint write of a run (worker/faults.py loads the hooks from tests/support/).
    fault_kill_after_checkpoint: int = 0
    # ... or right before its Nth checkpoint write (N=1: before the run's input is recorded).
    fault_kill_before_checkpoint: int = 0
    # ... or right after its Nth commit of a tool call's outcome to the ledger (worker/tools/ledger.py).
    fault_kill_after_outcome: int = 0
    # ... or hold a call of a tool at a point of its way through the ledger until killed from
    # outside: "before_intent:TOOL", "after_intent:TOOL" or "before_outcome:TOOL".
    fault_hold_call: str | None = None
    # Test-only: the API's thread reads of this conversation never end (api/store.py).
    fault_hang_read: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``env`` (the process environment by default).

        Raises :class:`SettingsError` naming the first variable with a bad value.
        """
        env = os.environ if env is None else env
        d = cls()
        api_host = env.get("API_HOST") or d.api_host
        try:
            if api_host not in ("localhost",):
                ipaddress.ip_address(api_host)
        except ValueError:
            if not api_host.replace("-", "").replace(".", "").isalnum():
                raise SettingsError("API_HOST", f"not an address or host name: {api_host!r}") from None
        port = _int(env, "API_PORT", d.api_port, minimum=0)
        if port > 65535:
            raise SettingsError("API_PORT", f"must be at most 65535, got {port}")
        oidc = _oidc(env)
        return cls(
            database_path=_path(env, "DATABASE_PATH", "data/db/sophos.db"),
            store_path=_path(env, "STORE_PATH", "") if env.get("STORE_PATH") else None,
            database_url=_database_url(env, "DATABASE_URL"),
            run_lease_seconds=_float(env, "RUN_LEASE_SECONDS", d.run_lease_seconds, minimum=1.0),
            redis_url=_url(env, "REDIS_URL", d.redis_url, ("redis", "rediss", "unix")),
            ollama_host=_url(env, "OLLAMA_HOST", d.ollama_host, ("http", "https")),
            ollama_model=env.get("OLLAMA_MODEL") or d.ollama_model,
            ollama_think=_optional_bool(env, "OLLAMA_THINK"),
            config_dir=_path(env, "CONFIG_DIR", "config"),
            memory_file_path=_path(env, "MEMORY_FILE_PATH", "data/memory/memory.jsonl"),
            agent_recursion_limit=_int(env, "AGENT_RECURSION_LIMIT", d.agent_recursion_limit, minimum=1),
            shutdown_timeout=_float(env, "SHUTDOWN_TIMEOUT", d.shutdown_timeout),
            worker_concurrency=_int(env, "WORKER_CONCURRENCY", d.worker_concurrency, minimum=1),
            approval_timeout=_optional_seconds(env, "APPROVAL_TIMEOUT"),
            conversation_retention_days=_optional_positive(env, "CONVERSATION_RETENTION_DAYS", "days"),
            api_host=api_host,
            api_port=port,
            api_token=env.get("API_TOKEN") or None,
            allow_unauthenticated=_bool(env, "ALLOW_UNAUTHENTICATED", d.allow_unauthenticated),
            forwarded_allow_ips=_addresses(env, "FORWARDED_ALLOW_IPS", d.forwarded_allow_ips),
            rate_limit_per_minute=_int(env, "RATE_LIMIT_PER_MINUTE", d.rate_limit_per_minute),
            user_max_active_runs=_int(env, "USER_MAX_ACTIVE_RUNS", d.user_max_active_runs),
            max_streams_per_client=_int(env, "MAX_STREAMS_PER_CLIENT", d.max_streams_per_client),
            cors_origins=_origins(env, "CORS_ORIGINS"),
            auth_oidc_issuer=oidc.issuer,
            auth_oidc_audience=oidc.audience,
            auth_oidc_user_claim=oidc.user_claim,
            auth_oidc_operator_claim=oidc.operator_claim,
            auth_oidc_operator_value=oidc.operator_value,
            auth_oidc_page_client=oidc.page_client,
            auth_oidc_page_scope=env.get("AUTH_OIDC_PAGE_SCOPE") or d.auth_oidc_page_scope,
            auth_adopt_owner=_user_name(env, "AUTH_ADOPT_OWNER"),
            webhook_allow_http=_bool(env, "WEBHOOK_ALLOW_HTTP", d.webhook_allow_http),
            webhook_allow_private=_bool(env, "WEBHOOK_ALLOW_PRIVATE", d.webhook_allow_private),
            webhook_attempts=_int(env, "WEBHOOK_ATTEMPTS", d.webhook_attempts, minimum=1),
            webhook_retry_seconds=_float(env, "WEBHOOK_RETRY_SECONDS", d.webhook_retry_seconds, minimum=0.01),
            webhook_timeout=_float(env, "WEBHOOK_TIMEOUT", d.webhook_timeout, minimum=0.1),
            log_format=_choice(env, "LOG_FORMAT", d.log_format, ("auto", "json", "console")),
            log_content=_bool(env, "LOG_CONTENT", d.log_content),
            event_retention=_int(env, "EVENT_RETENTION", d.event_retention, minimum=1),
            event_max_per_run=_int(env, "EVENT_MAX_PER_RUN", d.event_max_per_run, minimum=10),
            max_body_bytes=_int(env, "MAX_BODY_BYTES", d.max_body_bytes, minimum=1024),
            max_message_chars=_int(env, "MAX_MESSAGE_CHARS", d.max_message_chars, minimum=1),
            sse_ping_interval=_float(env, "SSE_PING_INTERVAL", d.sse_ping_interval, minimum=0.01),
            sse_client_timeout=_float(env, "SSE_CLIENT_TIMEOUT", d.sse_client_timeout, minimum=0.1),
            poll_delay=_float(env, "POLL_DELAY", d.poll_delay, minimum=0.001),
            mcp_call_timeout=_float(env, "MCP_CALL_TIMEOUT", d.mcp_call_timeout, minimum=0.01),
            mcp_start_timeout=_float(env, "MCP_START_TIMEOUT", d.mcp_start_timeout, minimum=0.01),
            model_timeout=_float(env, "MODEL_TIMEOUT", d.model_timeout, minimum=0.01),
            read_timeout=_float(env, "READ_TIMEOUT", d.read_timeout, minimum=0.1),
            reader_idle_seconds=_float(env, "READER_IDLE_SECONDS", d.reader_idle_seconds, minimum=0.1),
            event_loop=_choice(env, "EVENT_LOOP", d.event_loop, ("auto", "uvloop", "asyncio")),
            redis_parser=_choice(env, "REDIS_PARSER", d.redis_parser, ("auto", "hiredis", "python")),
            json_codec=_choice(env, "JSON_CODEC", d.json_codec, ("auto", "msgspec", "json")),
            api_http=_choice(env, "API_HTTP", d.api_http, ("auto", "httptools", "h11")),
            tracing=_otlp_traces(env),
            own_redis=not env.get("REDIS_URL"),
            launch_redis_port=_optional_port(env, "SOPHOS_REDIS_PORT"),
            launch_redis_dir=_path(env, "SOPHOS_REDIS_DIR", "data/redis"),
            launch_restart_reset=_float(env, "SOPHOS_RESTART_RESET", d.launch_restart_reset),
            fault_kill_after_checkpoint=_int(env, "SOPHOS_FAULT_KILL_AFTER_CHECKPOINT", 0),
            fault_kill_before_checkpoint=_int(env, "SOPHOS_FAULT_KILL_BEFORE_CHECKPOINT", 0),
            fault_kill_after_outcome=_int(env, "SOPHOS_FAULT_KILL_AFTER_OUTCOME", 0),
            fault_hold_call=_hold_call(env, "SOPHOS_FAULT_HOLD_CALL"),
            fault_hang_read=env.get("SOPHOS_FAULT_HANG_READ") or None,
        )

    def __repr__(self) -> str:
        """Every field, secrets hidden: a repr ends up in logs and tracebacks."""
        shown = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in _SECRET_FIELDS and value is not None:
                value = "***"
            elif field.name in _URL_FIELDS and value is not None:
                value = redact_url(value)
            shown.append(f"{field.name}={value!r}")
        return f"Settings({', '.join(shown)})"

    def replace(self, **changes: object) -> Settings:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @property
    def system_prompt_path(self) -> Path:
        return self.config_dir / "system.md"

    @property
    def mcp_config_path(self) -> Path:
        return self.config_dir / "mcp.json"

    @property
    def on_postgres(self) -> bool:
        return self.database_url is not None

    @property
    def database_name(self) -> str:
        """Where the state is, for logs and messages: the file, or the URL without its password."""
        if self.database_url is None:
            return str(self.database_path)
        return redact_url(self.database_url)

    @property
    def auth_configured(self) -> bool:
        """True when a credential is configured in the settings (API_TOKEN or an OIDC issuer);
        keys made by ``sophos users add`` are in force too once a user exists (api/auth/)."""
        return self.api_token is not None or self.auth_oidc_issuer is not None

    @property
    def lock_path(self) -> Path:
        return self.database_path.with_name(self.database_path.name + ".lock")


#: shown as ``***`` by ``repr(settings)``
_SECRET_FIELDS = frozenset({"api_token"})
#: shown without their passwords (:func:`redact_url`)
_URL_FIELDS = frozenset({"database_url", "redis_url", "ollama_host"})


#: a user's name: what keys are made for and what owns resources (shared/users.py)
USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@|:+-]{0,127}")


def _user_name(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(name)
    if not raw:
        return None
    if not USER_NAME.fullmatch(raw):
        raise SettingsError(name, f"not a user name (letters, digits and ._@|:+-, at most 128): {raw!r}")
    return raw


@dataclass(frozen=True)
class _Oidc:
    issuer: str | None
    audience: str | None
    user_claim: str
    operator_claim: str | None
    operator_value: str | None
    page_client: str | None


def _oidc(env: Mapping[str, str]) -> _Oidc:
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
    return _Oidc(issuer.rstrip("/") if issuer else None, audience,
                 env.get("AUTH_OIDC_USER_CLAIM") or "sub", claim, value, page_client)
