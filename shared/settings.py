"""Typed settings, read once from the environment by each entry point.

Nothing here reads ``os.environ`` at import time: a process calls
:meth:`Settings.from_env` in its entry point and passes the result down.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from shared import settings_parsing as parse
from shared.redaction import redact_url
from shared.settings_parsing import SettingsError


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
    # a run whose lease lapsed is marked interrupted by any live worker (worker/run/lifetime/leases.py).
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
    # CHECKPOINT_PRUNE: ``latest`` has the worker's upkeep prune the checkpoints each conversation
    # no longer needs as conversations change (worker/upkeep/pruning.py); ``off`` keeps them all.
    checkpoint_prune: str = "off"
    # MESSAGES_SNAPSHOT_EVERY: a full copy of a thread's messages every this many updates
    # (shared/storage/threads/state.py); pruning keeps each branch back to its newest copy, so fewer
    # updates between copies leave less to keep and more bytes in each copy.
    messages_snapshot_every: int = 100
    # Minutes a thread made by the Agent Protocol's POST /threads may stay empty (never run)
    # before the worker deletes it, when its creator gave it no ``ttl`` (worker/upkeep/expiry.py).
    empty_thread_retention_minutes: float = 1440.0
    # Threads created empty (never run) each user may hold at once; the next POST /threads is
    # 409 TOO_MANY_EMPTY_THREADS. 0 turns the limit off.
    user_max_empty_threads: int = 1000
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
    # (shared/redis/scripts/); the next is 429 with Retry-After. 0 turns the limit off.
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
    # Tokens the worker produces within this many milliseconds of each other are written to
    # Redis together, up to EVENT_COALESCE_TOKENS of them in one stream entry (1: an entry per
    # token). Each stays its own SSE event with its own id.
    event_coalesce_ms: float = 2.0
    event_coalesce_tokens: int = 64
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
    # ... or right after its Nth commit of a tool call's outcome (worker/tools/ledger/records.py).
    fault_kill_after_outcome: int = 0
    # ... or hold a call of a tool at a point of its way through the ledger until killed from
    # outside: "before_intent:TOOL", "after_intent:TOOL", "before_task_state:TOOL" (an MCP task
    # made, its id not yet committed) or "before_outcome:TOOL".
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
        port = parse.integer(env, "API_PORT", d.api_port, minimum=0)
        if port > 65535:
            raise SettingsError("API_PORT", f"must be at most 65535, got {port}")
        oidc = parse.oidc(env)
        return cls(
            database_path=parse.path(env, "DATABASE_PATH", "data/db/sophos.db"),
            store_path=parse.path(env, "STORE_PATH", "") if env.get("STORE_PATH") else None,
            database_url=parse.database_url(env, "DATABASE_URL"),
            run_lease_seconds=parse.number(env, "RUN_LEASE_SECONDS", d.run_lease_seconds, minimum=1.0),
            redis_url=parse.url(env, "REDIS_URL", d.redis_url, ("redis", "rediss", "unix")),
            ollama_host=parse.url(env, "OLLAMA_HOST", d.ollama_host, ("http", "https")),
            ollama_model=env.get("OLLAMA_MODEL") or d.ollama_model,
            ollama_think=parse.optional_bool(env, "OLLAMA_THINK"),
            config_dir=parse.path(env, "CONFIG_DIR", "config"),
            memory_file_path=parse.path(env, "MEMORY_FILE_PATH", "data/memory/memory.jsonl"),
            agent_recursion_limit=parse.integer(
                env, "AGENT_RECURSION_LIMIT", d.agent_recursion_limit, minimum=1
            ),
            shutdown_timeout=parse.number(env, "SHUTDOWN_TIMEOUT", d.shutdown_timeout),
            worker_concurrency=parse.integer(env, "WORKER_CONCURRENCY", d.worker_concurrency, minimum=1),
            approval_timeout=parse.optional_seconds(env, "APPROVAL_TIMEOUT"),
            conversation_retention_days=parse.optional_positive(env, "CONVERSATION_RETENTION_DAYS", "days"),
            checkpoint_prune=parse.choice(env, "CHECKPOINT_PRUNE", d.checkpoint_prune, ("off", "latest")),
            messages_snapshot_every=parse.integer(
                env, "MESSAGES_SNAPSHOT_EVERY", d.messages_snapshot_every, minimum=1
            ),
            empty_thread_retention_minutes=parse.optional_positive(
                env, "EMPTY_THREAD_RETENTION_MINUTES", "minutes"
            ) or d.empty_thread_retention_minutes,
            user_max_empty_threads=parse.integer(env, "USER_MAX_EMPTY_THREADS", d.user_max_empty_threads),
            api_host=api_host,
            api_port=port,
            api_token=env.get("API_TOKEN") or None,
            allow_unauthenticated=parse.boolean(env, "ALLOW_UNAUTHENTICATED", d.allow_unauthenticated),
            forwarded_allow_ips=parse.addresses(env, "FORWARDED_ALLOW_IPS", d.forwarded_allow_ips),
            rate_limit_per_minute=parse.integer(env, "RATE_LIMIT_PER_MINUTE", d.rate_limit_per_minute),
            user_max_active_runs=parse.integer(env, "USER_MAX_ACTIVE_RUNS", d.user_max_active_runs),
            max_streams_per_client=parse.integer(env, "MAX_STREAMS_PER_CLIENT", d.max_streams_per_client),
            cors_origins=parse.origins(env, "CORS_ORIGINS"),
            auth_oidc_issuer=oidc.issuer,
            auth_oidc_audience=oidc.audience,
            auth_oidc_user_claim=oidc.user_claim,
            auth_oidc_operator_claim=oidc.operator_claim,
            auth_oidc_operator_value=oidc.operator_value,
            auth_oidc_page_client=oidc.page_client,
            auth_oidc_page_scope=env.get("AUTH_OIDC_PAGE_SCOPE") or d.auth_oidc_page_scope,
            auth_adopt_owner=parse.user_name(env, "AUTH_ADOPT_OWNER"),
            webhook_allow_http=parse.boolean(env, "WEBHOOK_ALLOW_HTTP", d.webhook_allow_http),
            webhook_allow_private=parse.boolean(env, "WEBHOOK_ALLOW_PRIVATE", d.webhook_allow_private),
            webhook_attempts=parse.integer(env, "WEBHOOK_ATTEMPTS", d.webhook_attempts, minimum=1),
            webhook_retry_seconds=parse.number(
                env, "WEBHOOK_RETRY_SECONDS", d.webhook_retry_seconds, minimum=0.01
            ),
            webhook_timeout=parse.number(env, "WEBHOOK_TIMEOUT", d.webhook_timeout, minimum=0.1),
            log_format=parse.choice(env, "LOG_FORMAT", d.log_format, ("auto", "json", "console")),
            log_content=parse.boolean(env, "LOG_CONTENT", d.log_content),
            event_retention=parse.integer(env, "EVENT_RETENTION", d.event_retention, minimum=1),
            event_max_per_run=parse.integer(env, "EVENT_MAX_PER_RUN", d.event_max_per_run, minimum=10),
            event_coalesce_ms=parse.number(env, "EVENT_COALESCE_MS", d.event_coalesce_ms),
            event_coalesce_tokens=parse.integer(
                env, "EVENT_COALESCE_TOKENS", d.event_coalesce_tokens, minimum=1
            ),
            max_body_bytes=parse.integer(env, "MAX_BODY_BYTES", d.max_body_bytes, minimum=1024),
            max_message_chars=parse.integer(env, "MAX_MESSAGE_CHARS", d.max_message_chars, minimum=1),
            sse_ping_interval=parse.number(env, "SSE_PING_INTERVAL", d.sse_ping_interval, minimum=0.01),
            sse_client_timeout=parse.number(env, "SSE_CLIENT_TIMEOUT", d.sse_client_timeout, minimum=0.1),
            poll_delay=parse.number(env, "POLL_DELAY", d.poll_delay, minimum=0.001),
            mcp_call_timeout=parse.number(env, "MCP_CALL_TIMEOUT", d.mcp_call_timeout, minimum=0.01),
            mcp_start_timeout=parse.number(env, "MCP_START_TIMEOUT", d.mcp_start_timeout, minimum=0.01),
            model_timeout=parse.number(env, "MODEL_TIMEOUT", d.model_timeout, minimum=0.01),
            read_timeout=parse.number(env, "READ_TIMEOUT", d.read_timeout, minimum=0.1),
            reader_idle_seconds=parse.number(env, "READER_IDLE_SECONDS", d.reader_idle_seconds, minimum=0.1),
            event_loop=parse.choice(env, "EVENT_LOOP", d.event_loop, ("auto", "uvloop", "asyncio")),
            redis_parser=parse.choice(env, "REDIS_PARSER", d.redis_parser, ("auto", "hiredis", "python")),
            json_codec=parse.choice(env, "JSON_CODEC", d.json_codec, ("auto", "msgspec", "json")),
            api_http=parse.choice(env, "API_HTTP", d.api_http, ("auto", "httptools", "h11")),
            tracing=parse.otlp_traces(env),
            own_redis=not env.get("REDIS_URL"),
            launch_redis_port=parse.optional_port(env, "SOPHOS_REDIS_PORT"),
            launch_redis_dir=parse.path(env, "SOPHOS_REDIS_DIR", "data/redis"),
            launch_restart_reset=parse.number(env, "SOPHOS_RESTART_RESET", d.launch_restart_reset),
            fault_kill_after_checkpoint=parse.integer(env, "SOPHOS_FAULT_KILL_AFTER_CHECKPOINT", 0),
            fault_kill_before_checkpoint=parse.integer(env, "SOPHOS_FAULT_KILL_BEFORE_CHECKPOINT", 0),
            fault_kill_after_outcome=parse.integer(env, "SOPHOS_FAULT_KILL_AFTER_OUTCOME", 0),
            fault_hold_call=parse.hold_call(env, "SOPHOS_FAULT_HOLD_CALL"),
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

