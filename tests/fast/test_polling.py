"""The tests' waits (tests/support/client.py ``wait_for``): polled often for a second, then less."""

from __future__ import annotations

import itertools

import pytest

from tests.support import client


def test_polls_come_every_interval_for_a_second_then_further_apart_up_to_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(client.time, "monotonic", lambda: now[0])
    sleeps = client.poll_intervals(0.05)
    first = []
    for _ in range(5):
        first.append(next(sleeps))
        now[0] += 0.05
    assert first == [0.05] * 5  # within the first second
    now[0] += 1.0
    later = list(itertools.islice(sleeps, 8))
    assert later[0] == pytest.approx(0.075) and later[1] == pytest.approx(0.1125)
    assert later == sorted(later) and later[-1] == client.POLL_CAP


def test_a_callers_longer_interval_is_kept() -> None:
    assert list(itertools.islice(client.poll_intervals(0.5), 3)) == [0.5, 0.5, 0.5]
