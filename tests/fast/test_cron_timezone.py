"""A cron's ``timezone`` (shared/contracts/crons.py): its fields in that zone's wall-clock time,
stored as cron's ``CRON_TZ=<zone> <expression>``."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from shared.contracts.crons import Schedule
from shared.errors import BadRequest


def at(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()


def test_a_schedule_in_a_zone_fires_at_its_wall_clock_time_summer_and_winter() -> None:
    paris = Schedule.parse("0 9 * * *", "Europe/Paris")
    assert paris.text == "CRON_TZ=Europe/Paris 0 9 * * *" and paris.expression == "0 9 * * *"
    assert paris.next_after(at(2026, 1, 15)) == at(2026, 1, 15, 8)  # UTC+1
    assert paris.next_after(at(2026, 7, 15)) == at(2026, 7, 15, 7)  # UTC+2
    again = Schedule.parse(paris.text)  # as the worker reads it back
    assert (again.zone, again.next_after(at(2026, 7, 15))) == ("Europe/Paris", at(2026, 7, 15, 7))


def test_utc_is_no_zone_and_bad_zones_are_refused_by_name() -> None:
    assert Schedule.parse("0 9 * * *", "UTC").text == "0 9 * * *"
    assert Schedule.parse("0 9 * * *").zone is None
    for bad in ("Mars/Olympus", "../etc/passwd", "", 5):
        with pytest.raises(BadRequest, match="timezone"):
            Schedule.parse("0 9 * * *", bad)  # type: ignore[arg-type]
    with pytest.raises(BadRequest, match="once"):
        Schedule.parse("CRON_TZ=Asia/Tokyo 0 9 * * *", "Europe/Paris")
