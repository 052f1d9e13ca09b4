"""Settings are read once from a mapping; a bad value names its variable."""

from __future__ import annotations

import pytest

from shared.settings import Settings, SettingsError


def test_defaults_and_overrides() -> None:
    s = Settings.from_env({})
    assert s.agent_recursion_limit == 25 and s.shutdown_timeout == 30 and s.api_host == "127.0.0.1"
    assert s.database_path.is_absolute() and s.database_path.name == "sophos.db"
    s = Settings.from_env({"AGENT_RECURSION_LIMIT": "7", "OLLAMA_THINK": "false", "API_TOKEN": "t"})
    assert s.agent_recursion_limit == 7 and s.ollama_think is False and s.api_token == "t"
    assert s.approval_timeout is None and Settings.from_env({"APPROVAL_TIMEOUT": "90"}).approval_timeout == 90
    assert s.worker_concurrency == 1
    assert Settings.from_env({"WORKER_CONCURRENCY": "4"}).worker_concurrency == 4


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
    ],
)
def test_bad_value_names_the_variable(variable: str, value: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({variable: value})
    assert caught.value.variable == variable and variable in str(caught.value)
