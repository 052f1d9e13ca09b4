"""The test harness's readiness check (tests/support/procs.py) against a heartbeat that expires
between its two reads: a CI run took a killed worker's last beat, gone between TYPE and GET, for
"a heartbeat without a pid", so the new worker counted as ready before it had recovered anything."""

from __future__ import annotations

from typing import Any

from tests.support.procs import _heartbeat_pid


class _Expiring:
    """TYPE still sees the key; every read after it finds it gone (its TTL ended in between)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def type(self, key: str) -> bytes:
        return self.kind.encode()

    def get(self, key: str) -> Any:
        return None

    def hget(self, key: str, field: str) -> Any:
        return None

    def exists(self, key: str) -> int:
        return 0


class _Beat(_Expiring):
    def __init__(self, value: bytes) -> None:
        super().__init__("string")
        self.value = value

    def get(self, key: str) -> Any:
        return self.value


def test_a_heartbeat_gone_between_two_reads_is_no_heartbeat() -> None:
    assert _heartbeat_pid(_Expiring("string")) is None  # type: ignore[arg-type]
    assert _heartbeat_pid(_Expiring("hash")) is None  # type: ignore[arg-type]
    assert _heartbeat_pid(_Expiring("none")) is None  # type: ignore[arg-type]


def test_a_heartbeat_names_its_pid_or_none() -> None:
    assert _heartbeat_pid(_Beat(b'{"pid": 4242}')) == 4242  # type: ignore[arg-type]
    assert _heartbeat_pid(_Beat(b'{"id": "w"}')) is True  # type: ignore[arg-type]
