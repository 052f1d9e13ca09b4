"""When the tests fork a worker or an API and when they start it fresh (tests/support/forkserver.py)."""

from __future__ import annotations

from pathlib import Path

from tests.support import forkserver


def test_forking_is_on_unless_switched_off() -> None:
    assert forkserver.enabled({})
    assert forkserver.enabled({forkserver.SWITCH: "1"})
    assert not forkserver.enabled({forkserver.SWITCH: "0"})


def test_what_is_read_at_start_is_the_signature_and_the_rest_is_not() -> None:
    env = {"PYTHONPATH": "/x", "PYTHONUNBUFFERED": "1", "LANGGRAPH_STRICT_MSGPACK": "true",
           "REDIS_URL": "redis://127.0.0.1:1", "API_PORT": "8000", "PATH": "/bin"}
    assert forkserver.startup_signature(env) == {
        "PYTHONPATH": "/x", "PYTHONUNBUFFERED": "1", "LANGGRAPH_STRICT_MSGPACK": "true"}


def test_a_stand_in_in_the_working_directory_gets_a_fresh_process(tmp_path: Path) -> None:
    servers = forkserver.ForkServers(tmp_path)
    (tmp_path / "worker.py").write_text("")
    (tmp_path / "api").mkdir()
    for module in ("worker", "api"):
        assert servers.spawn(module, [], {}, tmp_path, tmp_path / "log") is None
    assert servers.spawn("granian", [], {}, None, tmp_path / "log") is None  # no fork server for it
