"""Fixtures: a real Redis, the fake model, the test's environment, service processes.

Each test gets its own ``tmp_path`` (database, config, logs), the session's Redis
flushed and the session's fake model reset. Worker and API run as real
subprocesses (``procs``); their logs are attached to the report of a failed test.

Tiers (``./sophos test``, tests/support/tiers.py): tests marked ``fast`` (everything in
tests/fast/, and the pure tests of other files listed in :data:`FAST_ELSEWHERE`) run
first, in one process; the rest run after, spread over xdist workers. Every session
fixture here is per worker (each xdist worker has its own Redis, fake model and
PostgreSQL database prefix); a module whose tests share one server or browser is kept
in one worker (:data:`ONE_WORKER_MODULES`). The web modules' browser fixtures (``playwright``,
``browser``, ``offline``, ``service``) are tests/support/browser.py's, and the Agent Protocol
modules' ``client`` tests/support/agent_protocol.py's, imported here.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_sync
from redis.asyncio import Redis

from tests.fakes.ollama import FakeOllama
from tests.support import forkserver
from tests.support import procs as procs_module
from tests.support.agent_protocol import client  # noqa: F401 - a fixture
from tests.support.browser import browser, offline, playwright, service  # noqa: F401 - fixtures
from tests.support.env import SophosEnv, make_sophos_env
from tests.support.forkserver import ForkServers
from tests.support.ports import free_port
from tests.support.postgres import PostgresServer
from tests.support.procs import ProcessGroup, ServiceProcess
from tests.support.redis_server import RedisServer
from tests.support.tiers import ALONE, FAST_DIR, FAST_ELSEWHERE, FAST_MARK, fast_files

_PROCS_KEY = pytest.StashKey[ProcessGroup]()
_REDIS_KEY = pytest.StashKey[list[RedisServer]]()


# --- tiers ---------------------------------------------------------------------------------

#: Fixtures that start a process or a server: a fast test uses none of them.
PROCESS_FIXTURES = frozenset({
    "redis_server", "start_redis", "redis", "redis_sync_client", "fake_ollama", "model", "postgres_server",
    "postgres_url", "sophos_env", "tools_log", "procs", "start_worker", "start_api",
})

#: Modules whose tests share a module-scoped server or browser (or module state): one
#: xdist worker runs all of a module's tests, so it is started once.
ONE_WORKER_MODULES = frozenset({
    "test_agent_chat_ui.py", "test_agent_protocol.py", "test_agent_protocol_assistants.py",
    "test_agent_protocol_defaults.py", "test_agent_protocol_enqueue.py", "test_agent_protocol_forks.py",
    "test_agent_protocol_lifetimes.py",
    "test_agent_protocol_rest.py", "test_agent_protocol_store.py",
    "test_branches.py", "test_fuzz.py",
    "test_kill_points.py", "test_mcp_server.py", "test_packaging.py", "test_postgres_listing.py",
    "test_remote_tools.py",
    "test_tool_tasks.py",
    "test_tracing.py", "test_web.py", "test_web_basics.py",
    "test_web_branches.py", "test_web_people.py",
    # a module-scoped stack (tests/support/stacks.py) beside tests with stacks of their own
    "test_approvals.py", "test_cli.py", "test_cli_approve.py", "test_identities.py", "test_webhooks.py",
})


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C tests send real SIGINTs to the CLI: its children must not inherit SIGINT ignored.

    A suite started in the background of a non-interactive shell (``cmd &``, as a CI runner
    may) has SIGINT ignored, every process below inherits that, and Python then installs no
    KeyboardInterrupt handler in the CLI. A handler of ours resets to the default at exec.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` (the tiers' choice): each of :data:`ONE_WORKER_MODULES` is one unit of
    work, given whole to one xdist worker; every other test is a unit of its own.

    xdist's own grouping reads ``xdist_group`` marks and appends the group to the test's
    ``item._nodeid``, which pytest 9 no longer reads (its node ids are ``item._id``): with
    pytest 9.2 and xdist 3.8 every group was spread over all workers, each starting the module's
    shared stack again, and modules whose tests must not overlap (tests/test_kill_points.py)
    overlapped. The module is known from the node id itself here, whatever pytest does with marks.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerModules(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if Path(module).name in ONE_WORKER_MODULES else nodeid

    return OneWorkerModules(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the fast tier and the timing-bound tests.

    A test of tests/fast/ that asks for a process fixture is left out of the fast tier (it
    runs with the real-process tests), with a warning saying where it belongs. A test marked
    ``fast`` in a file the fast tier does not collect (tests/support/tiers.py ``fast_files``) would
    run in neither tier: refused.
    """
    fast_home = set(fast_files())
    for item in items:
        path = item.path
        in_tests = path.parent == FAST_DIR.parent
        pure = FAST_ELSEWHERE.get(path.name, frozenset()) if in_tests else frozenset()
        if path.is_relative_to(FAST_DIR) or getattr(item, "originalname", item.name) in pure:
            uses = sorted(PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())))
            if uses:
                item.warn(pytest.PytestWarning(
                    f"{item.nodeid} asks for {', '.join(uses)}: not a fast test (it runs with the "
                    "real-process tiers); move it out of tests/fast/ or FAST_ELSEWHERE"
                ))
            else:
                item.add_marker(pytest.mark.fast)
        if in_tests and getattr(item, "originalname", item.name) in ALONE.get(path.name, frozenset()):
            item.add_marker(pytest.mark.alone)
        if (item.get_closest_marker("fast") and not path.is_relative_to(FAST_DIR)
                and path not in fast_home):
            raise pytest.UsageError(
                f"{item.nodeid} is marked fast, but the fast tier does not collect {path.name}: mark it "
                f"with pytest.{FAST_MARK} in its file or list it in FAST_ELSEWHERE (tests/support/tiers.py)"
            )


# --- service processes ------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def fork_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServers | None]:
    """Workers and APIs forked ready imported (tests/support/forkserver.py), unless
    ``SOPHOS_TEST_FORK=0``; a server starts at its module's first request."""
    if not forkserver.enabled():
        yield None
        return
    servers = ForkServers(tmp_path_factory.mktemp("forkservers"))
    procs_module.FORK_SERVERS = servers
    try:
        yield servers
    finally:
        procs_module.FORK_SERVERS = None
        servers.close()


# --- Redis ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the session (no persistence). ``.url``, ``.port``."""
    server = RedisServer(tmp_path_factory.mktemp("redis-session"), appendonly=False)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def start_redis(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., RedisServer]]:
    """Factory for a Redis of the test's own, AOF on by default, stopped at teardown.

    ``start_redis(appendonly=True, dir=None, port=None, extra_config=None)``; restart
    it with ``server.restart(signal.SIGKILL)`` or ``server.stop(...)`` then
    ``server.start()``: same port, same directory.
    """
    servers: list[RedisServer] = []
    request.node.stash[_REDIS_KEY] = servers

    def start(
        appendonly: bool = True,
        dir: Path | None = None,
        port: int | None = None,
        extra_config: dict[str, str] | None = None,
    ) -> RedisServer:
        server = RedisServer(
            dir or tmp_path / f"redis-{len(servers) + 1}",
            port=port,
            appendonly=appendonly,
            extra_config=extra_config,
        )
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop(signal.SIGKILL)


def _flush(url: str) -> None:
    connection = redis_sync.Redis.from_url(url)
    try:
        connection.flushall()
    finally:
        connection.close()


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[Redis]:
    """An async client (``decode_responses=True``) to the session Redis, flushed first."""
    connection = Redis.from_url(redis_server.url, decode_responses=True)
    await connection.flushall()
    yield connection
    await connection.aclose()


@pytest.fixture
def redis_sync_client(redis_server: RedisServer) -> Iterator[redis_sync.Redis]:
    """A synchronous client (``decode_responses=True``) to the session Redis, flushed first."""
    connection = redis_sync.Redis.from_url(redis_server.url, decode_responses=True)
    connection.flushall()
    yield connection
    connection.close()


# --- the model -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def fake_ollama() -> Iterator[FakeOllama]:
    """The session's fake Ollama (model ``test-model``), for module-scoped stacks. A test's
    own is ``model``."""
    with FakeOllama(["test-model"]) as fake:
        yield fake


@pytest.fixture
def model(request: pytest.FixtureRequest) -> Iterator[FakeOllama]:
    """The fake Ollama this test's processes ask (model ``test-model``): ``model.script(Text(...))``.

    A fake of the test's own, on its own port, so a process an earlier test left behind can
    neither take this test's scripted replies nor be counted among its requests; unless the test
    runs on a module's shared stack, started with the session's ``fake_ollama``: then that one,
    reset.
    """
    if "fake_ollama" in request.fixturenames:
        shared: FakeOllama = request.getfixturevalue("fake_ollama")
        shared.reset()
        shared.default_text = "ok"
        shared.models = ["test-model:latest"]
        yield shared
        shared.reset()
        return
    with FakeOllama(["test-model:latest"]) as fake:
        yield fake
        fake.reset()  # cuts replies still hanging, so no handler thread outlives the test


# --- environment and processes -------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """The machine's PostgreSQL (skips the test, saying why, where none answers)."""
    server = PostgresServer()
    reason = server.unreachable()
    if reason is not None:
        pytest.skip(reason)
    yield server
    server.drop_all()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A fresh, empty PostgreSQL database for this test."""
    return postgres_server.create_database()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``@pytest.mark.backends``: the test runs once on SQLite and once on PostgreSQL."""
    if metafunc.definition.get_closest_marker("backends") and "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", ["sqlite", "postgresql"])


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """Which database the test's services use: SQLite unless the test is marked ``backends``."""
    return str(getattr(request, "param", "sqlite"))


@pytest.fixture
def sophos_env(
    tmp_path: Path, redis_server: RedisServer, model: FakeOllama, backend: str, request: pytest.FixtureRequest
) -> SophosEnv:
    """Environment for worker and API of this test (Redis flushed, model reset).

    A dict of variables with ``.root``, ``.tools_log``, ``.database_path``,
    ``.config_dir``, ``.api_url``; ``env.with_(NAME=value)`` makes a changed copy. On the
    ``postgresql`` backend ``DATABASE_URL`` names a fresh database of its own.
    """
    _flush(redis_server.url)
    overrides: dict[str, str] = {}
    if backend == "postgresql":
        # A short lease, so a dead worker's run is taken over within seconds.
        overrides.update(DATABASE_URL=request.getfixturevalue("postgres_url"), RUN_LEASE_SECONDS="3")
    env = make_sophos_env(tmp_path, redis_url=redis_server.url, ollama_url=model.url, api_port=free_port())
    return env.with_(**overrides)


@pytest.fixture
def tools_log(sophos_env: SophosEnv) -> Path:
    """The file the fake MCP tools server appends one line to per call."""
    return sophos_env.tools_log


@pytest.fixture
def procs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ProcessGroup]:
    """Service processes of this test; every one is killed (with its children) at teardown."""
    group = ProcessGroup(log_dir=tmp_path / "logs", cwd=tmp_path)
    request.node.stash[_PROCS_KEY] = group
    yield group
    group.close()


@pytest.fixture
def start_worker(procs: ProcessGroup) -> Callable[..., ServiceProcess]:
    """``start_worker(env, wait_ready=True, args=(), timeout=30) -> ServiceProcess``."""
    return procs.start_worker


@pytest.fixture
def start_api(procs: ProcessGroup) -> Callable[..., ServiceProcess]:
    """``start_api(env, port=None, wait_ready=True, args=(), timeout=30) -> ServiceProcess``."""
    return procs.start_api


# --- failure reports -----------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    """Attach the logs of the test's processes to the report of a failed phase."""
    report = yield
    if report.failed:
        group = item.stash.get(_PROCS_KEY, None)
        if group is not None:
            for title, text in group.report_sections():
                report.sections.append((f"{title} [{report.when}]", text))
        for server in item.stash.get(_REDIS_KEY, []):
            report.sections.append((f"redis port {server.port} log", server.log_text()[-5000:]))
    return report
