"""Settings are read once from a mapping; a bad value names its variable."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shared.settings import Settings
from shared.settings_parsing import SettingsError
from tests.support.env import SophosEnv
from tests.support.procs import ServiceProcess


def test_defaults_and_overrides() -> None:
    s = Settings.from_env({})
    assert s.agent_recursion_limit == 25 and s.shutdown_timeout == 30 and s.api_host == "127.0.0.1"
    assert s.database_path.is_absolute() and s.database_path.name == "sophos.db"
    s = Settings.from_env({"AGENT_RECURSION_LIMIT": "7", "OLLAMA_THINK": "false", "API_TOKEN": "t"})
    assert s.agent_recursion_limit == 7 and s.ollama_think is False and s.api_token == "t"
    assert s.approval_timeout is None and Settings.from_env({"APPROVAL_TIMEOUT": "90"}).approval_timeout == 90
    assert s.worker_concurrency == 1
    assert Settings.from_env({"WORKER_CONCURRENCY": "4"}).worker_concurrency == 4
    assert s.empty_thread_retention_minutes == 1440 and s.user_max_empty_threads == 1000
    few = Settings.from_env({"EMPTY_THREAD_RETENTION_MINUTES": "0.5", "USER_MAX_EMPTY_THREADS": "3"})
    assert few.empty_thread_retention_minutes == 0.5 and few.user_max_empty_threads == 3


def test_database_url_picks_postgresql_and_hides_its_password() -> None:
    lite = Settings.from_env({})
    assert lite.database_url is None and not lite.on_postgres
    assert lite.database_name == str(lite.database_path) and lite.run_lease_seconds == 30
    for scheme in ("postgresql", "postgres"):
        url = f"{scheme}://sophos:s3cret@db:5432/sophos"
        pg = Settings.from_env({"DATABASE_URL": url, "RUN_LEASE_SECONDS": "5"})
        assert pg.on_postgres and pg.database_url == url and pg.run_lease_seconds == 5
        assert pg.database_name == f"{scheme}://sophos:***@db:5432/sophos"
    assert Settings.from_env({"DATABASE_URL": ""}).database_url is None  # empty: SQLite, as unset


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("AGENT_RECURSION_LIMIT", "many"),
        ("AGENT_RECURSION_LIMIT", "0"),
        ("SHUTDOWN_TIMEOUT", "-1"),
        ("WORKER_CONCURRENCY", "0"),
        ("WORKER_CONCURRENCY", "four"),
        ("API_PORT", "70000"),
        ("REDIS_URL", "localhost:6379"),
        ("OLLAMA_HOST", "ftp://x"),
        ("LOG_FORMAT", "xml"),
        ("OLLAMA_THINK", "maybe"),
        ("DATABASE_PATH", "a\x00b"),
        ("APPROVAL_TIMEOUT", "soon"),
        ("APPROVAL_TIMEOUT", "0"),
        ("APPROVAL_TIMEOUT", "nan"),
        ("CONVERSATION_RETENTION_DAYS", "-3"),
        ("CONVERSATION_RETENTION_DAYS", "forever"),
        ("CHECKPOINT_PRUNE", "all"),
        ("MESSAGES_SNAPSHOT_EVERY", "0"),
        ("EMPTY_THREAD_RETENTION_MINUTES", "0"),
        ("EMPTY_THREAD_RETENTION_MINUTES", "a day"),
        ("USER_MAX_EMPTY_THREADS", "-1"),
        ("EVENT_LOOP", "trio"),
        ("REDIS_PARSER", "resp3"),
        ("JSON_CODEC", "orjson"),
        ("API_HTTP", "granian"),
        ("DATABASE_URL", "mysql://db/sophos"),
        ("DATABASE_URL", "postgresql://db:port/sophos"),
        ("DATABASE_URL", "postgresql://db:5432"),
        ("DATABASE_URL", "postgresql://db:5432/"),
        ("RUN_LEASE_SECONDS", "0.5"),
        ("RUN_LEASE_SECONDS", "long"),
        ("SOPHOS_FAULT_HOLD_CALL", "tools__slow"),
        ("SOPHOS_FAULT_HOLD_CALL", "during:tools__slow"),
        ("SOPHOS_FAULT_HOLD_CALL", "after_intent:"),
    ],
)
def test_bad_value_names_the_variable(variable: str, value: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({variable: value})
    assert caught.value.variable == variable and variable in str(caught.value)


def test_speedups_auto_takes_the_fast_one_and_a_missing_one_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shared import speedups
    from shared.speedups import Speedups

    auto = Settings.from_env(
        {"EVENT_LOOP": "auto", "REDIS_PARSER": "auto", "JSON_CODEC": "auto", "API_HTTP": "auto"}
    )
    assert Speedups.of(auto) == Speedups("uvloop", "hiredis", "msgspec", "httptools")
    plain = Settings.from_env(
        {"EVENT_LOOP": "asyncio", "REDIS_PARSER": "python", "JSON_CODEC": "json", "API_HTTP": "h11"}
    )
    assert Speedups.of(plain) == Speedups("asyncio", "python", "json", "h11")
    monkeypatch.setattr(speedups, "_installed", lambda module: False)
    assert Speedups.of(auto).event_loop == "asyncio" and Speedups.of(auto).json_codec == "json"
    assert Speedups.of(auto).api_http == "h11"
    with pytest.raises(SettingsError) as caught:
        Speedups.of(Settings.from_env({"EVENT_LOOP": "uvloop"}))
    assert caught.value.variable == "EVENT_LOOP" and "not installed" in str(caught.value)


def test_msgspec_codec_parses_the_same_as_json() -> None:
    import json
    import math

    from shared.contracts import codec as contracts
    from shared.contracts import runs

    values = [
        {"step": 1, "node": "agent", "name": "tools__echo", "data": {"text": "é \u2028 </script> \x00"}},
        "token", [1, 2.5, 1e16, 1e-7, -0.0, 2**70], {1: "int key", None: "null key"},
        {"status": runs.RunStatus.QUEUED}, ValueError("boom"),
    ]
    before = contracts.json_codec()
    try:
        contracts.use_json_codec("json")
        plain = [contracts.dumps(v) for v in values]
        contracts.use_json_codec("msgspec")
        fast = [contracts.dumps(v) for v in values]
        assert [json.loads(x) for x in fast] == [json.loads(x) for x in plain]
        assert [contracts.loads(x) for x in plain] == [json.loads(x) for x in plain]
        big = 123456789012345678901234567890
        assert contracts.loads(b'{"n":' + str(big).encode() + b"}") == {"n": big}
        # The one difference: json writes NaN bare (not JSON), msgspec writes null; both are read.
        assert contracts.dumps(math.nan) == b"null" and math.isnan(contracts.loads(b"NaN"))
        with pytest.raises(TypeError):
            contracts.dumps(object())
    finally:
        contracts.use_json_codec(before)


@pytest.mark.parametrize(
    "chosen",
    [
        {"EVENT_LOOP": "uvloop", "REDIS_PARSER": "hiredis", "JSON_CODEC": "msgspec", "API_HTTP": "httptools"},
        {"EVENT_LOOP": "asyncio", "REDIS_PARSER": "python", "JSON_CODEC": "json", "API_HTTP": "h11"},
    ],
)
def test_worker_and_api_run_on_the_chosen_loop_parser_and_codec(
    sophos_env: SophosEnv,
    start_worker: Callable[..., ServiceProcess],
    start_api: Callable[..., ServiceProcess],
    chosen: dict[str, str],
) -> None:
    env = sophos_env.with_(**chosen)
    worker, api = start_worker(env), start_api(env)
    expected = {"event_loop": chosen["EVENT_LOOP"], "redis_parser": chosen["REDIS_PARSER"],
                "json_codec": chosen["JSON_CODEC"]}
    for proc, event in ((worker, "worker.ready"), (api, "api.started")):
        [record] = [r for r in proc.log_records() if r.get("event") == event]
        assert {k: record.get(k) for k in expected} == expected, proc.name
    [started] = [r for r in api.log_records() if r.get("event") == "api.started"]
    assert started["http"] == chosen["API_HTTP"]
