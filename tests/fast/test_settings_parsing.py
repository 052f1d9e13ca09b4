"""Settings from the environment (shared/settings.py): booleans, numbers, URLs and what a repr shows.

tests/test_settings.py checks every variable's default and refusal; these are the
parsing rules they share.
"""

from __future__ import annotations

import pytest

from shared.redaction import redact_url
from shared.settings import Settings
from shared.settings_parsing import SettingsError


@pytest.mark.parametrize(("raw", "value"), [("1", True), ("TRUE", True), ("yes", True), ("On", True),
                                            ("0", False), ("false", False), ("NO", False), ("off", False)])
def test_a_boolean_is_one_of_four_words_each_way_in_any_case(raw: str, value: bool) -> None:
    assert Settings.from_env({"LOG_CONTENT": raw}).log_content is value
    assert Settings.from_env({"OLLAMA_THINK": raw}).ollama_think is value


def test_an_empty_variable_is_the_default_as_if_unset() -> None:
    default = Settings.from_env({})
    empty = Settings.from_env({name: "" for name in (
        "LOG_CONTENT", "OLLAMA_THINK", "API_PORT", "SHUTDOWN_TIMEOUT", "REDIS_URL", "API_TOKEN",
        "DATABASE_URL",
    )})
    assert empty == default and default.ollama_think is None and default.api_token is None


def test_a_refusal_names_the_variable_and_what_it_got() -> None:
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"EVENT_MAX_PER_RUN": "9"})
    assert refused.value.variable == "EVENT_MAX_PER_RUN" and "at least 10, got 9" in str(refused.value)
    with pytest.raises(SettingsError, match="LOG_CONTENT: expected true or false, got 'maybe'"):
        Settings.from_env({"LOG_CONTENT": "maybe"})


def test_a_refused_url_is_quoted_without_its_password() -> None:
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"REDIS_URL": "http://user:hunter2@cache:6379/0"})
    assert refused.value.variable == "REDIS_URL" and "hunter2" not in str(refused.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://cache:6379/0", "redis://cache:6379/0"),
        ("redis://:pw@cache:6379/0", "redis://:***@cache:6379/0"),
        ("postgresql://sophos:s3cret@db/sophos", "postgresql://sophos:***@db/sophos"),
        ("postgresql://sophos:a/b?c#d@db/sophos", "postgresql://sophos:***@db/sophos"),
        ("redis://cache/0?password=pw&db=1", "redis://cache/0?password=***&db=1"),
        ("user:pw@host", "user:***@host"),
    ],
)
def test_a_url_is_shown_without_its_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_the_repr_hides_the_token_and_the_passwords() -> None:
    settings = Settings.from_env({
        "API_TOKEN": "tok-123", "REDIS_URL": "redis://:pw-1@cache:6379/0",
        "DATABASE_URL": "postgresql://u:pw-2@db/sophos", "OLLAMA_HOST": "http://o:pw-3@ollama:11434",
    })
    shown = repr(settings)
    for secret in ("tok-123", "pw-1", "pw-2", "pw-3"):
        assert secret not in shown
    assert "api_token='***'" in shown and settings.api_token == "tok-123"


@pytest.mark.parametrize(("env", "variable"), [
    ({"AUTH_OIDC_ISSUER": "http://login.example.com", "AUTH_OIDC_AUDIENCE": "a"}, "AUTH_OIDC_ISSUER"),
    ({"AUTH_OIDC_ISSUER": "ftp://login.example.com", "AUTH_OIDC_AUDIENCE": "a"}, "AUTH_OIDC_ISSUER"),
    ({"AUTH_OIDC_ISSUER": "https://login.example.com"}, "AUTH_OIDC_AUDIENCE"),
    ({"AUTH_OIDC_OPERATOR_CLAIM": "groups"}, "AUTH_OIDC_OPERATOR_VALUE"),
    ({"AUTH_OIDC_OPERATOR_VALUE": "ops"}, "AUTH_OIDC_OPERATOR_CLAIM"),
    ({"AUTH_ADOPT_OWNER": "two words"}, "AUTH_ADOPT_OWNER"),
])
def test_identity_settings_are_checked_together(env: dict[str, str], variable: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(env)
    assert caught.value.variable == variable


def test_an_issuer_on_loopback_may_be_http_and_configures_identities() -> None:
    settings = Settings.from_env({"AUTH_OIDC_ISSUER": "http://127.0.0.1:9000/", "AUTH_OIDC_AUDIENCE": "a"})
    assert settings.auth_oidc_issuer == "http://127.0.0.1:9000" and settings.auth_oidc_user_claim == "sub"
    assert settings.auth_configured and not Settings.from_env({}).auth_configured
