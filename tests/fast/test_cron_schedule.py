"""Cron schedules (shared/contracts/crons.py): what parses, what is refused and why, when each fires next."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from shared.contracts.crons import CronCreate, CronRow, CronUpdate, Schedule, tick_run_id, tick_thread_id
from shared.errors import BadRequest
from worker.schedule.crons.ticker import LONGEST_SLEEP_SECONDS, RETRY_SECONDS, pause

#: Sunday 6 December 2026, 13:30:15.5 UTC
NOW = datetime(2026, 12, 6, 13, 30, 15, 500000, tzinfo=UTC).timestamp()


def next_of(schedule: str, after: float = NOW) -> datetime:
    return datetime.fromtimestamp(Schedule.parse(schedule).next_after(after), UTC)


@pytest.mark.parametrize(
    ("schedule", "fires"),
    [
        ("*/2 * * * * *", datetime(2026, 12, 6, 13, 30, 16, tzinfo=UTC)),  # seconds first
        ("0 9 * * *", datetime(2026, 12, 7, 9, 0, tzinfo=UTC)),
        ("*/15 * * * *", datetime(2026, 12, 6, 13, 45, tzinfo=UTC)),
        ("@hourly", datetime(2026, 12, 6, 14, 0, tzinfo=UTC)),
        ("30 8 * * 1-5", datetime(2026, 12, 7, 8, 30, tzinfo=UTC)),  # Monday to Friday
        ("0 12 * * sun", datetime(2026, 12, 13, 12, 0, tzinfo=UTC)),
        ("0 12 * * 7", datetime(2026, 12, 13, 12, 0, tzinfo=UTC)),  # 7 is Sunday too
        ("0 0 1 jan *", datetime(2027, 1, 1, 0, 0, tzinfo=UTC)),
        ("0 0 29 2 *", datetime(2028, 2, 29, 0, 0, tzinfo=UTC)),  # the next leap day
        # both day fields restricted: either matching fires (the 13th, or a Friday)
        ("0 0 13 * 5", datetime(2026, 12, 11, 0, 0, tzinfo=UTC)),
        ("0,30 1-3/2 * * *", datetime(2026, 12, 7, 1, 0, tzinfo=UTC)),
    ],
)
def test_the_next_tick(schedule: str, fires: datetime) -> None:
    assert next_of(schedule) == fires


def test_a_tick_is_strictly_after_the_time_given() -> None:
    tick = Schedule.parse("*/2 * * * * *").next_after(NOW)
    assert Schedule.parse("*/2 * * * * *").next_after(tick) == tick + 2


@pytest.mark.parametrize(
    ("schedule", "named"),
    [
        ("", "cron expression"),
        ("* * * *", "has 4 fields"),
        ("61 * * * *", "61 is out of the minute field's range 0-59"),
        ("* 24 * * *", "hour"),
        ("0 0 31 2 *", "never fires"),
        ("*/0 * * * *", "step '0'"),
        ("0 0 * * funday", "'funday' is not a value of the day-of-week field"),
        ("5-1 * * * *", "runs backwards"),
        ("every minute", "has 2 fields"),
    ],
)
def test_a_bad_schedule_is_refused_naming_the_problem(schedule: str, named: str) -> None:
    with pytest.raises(BadRequest, match=named):
        Schedule.parse(schedule)


def test_a_ticks_run_and_thread_are_the_same_for_every_worker() -> None:
    assert tick_run_id("c", 100) == tick_run_id("c", 100)
    assert tick_run_id("c", 100) != tick_run_id("c", 102) != tick_run_id("d", 100)
    assert tick_thread_id("c", 100) != tick_run_id("c", 100)


def test_a_ticker_sleeps_until_the_next_tick_within_bounds() -> None:
    tick = Schedule.parse("*/2 * * * * *").next_after(NOW)  # NOW + 0.5
    assert tick - NOW < pause(tick, NOW) < tick - NOW + 0.1  # just past the tick, never before it
    assert pause(None, NOW) == LONGEST_SLEEP_SECONDS  # no cron: a cron stored wakes it
    assert pause(int(NOW) + 3600, NOW) == LONGEST_SLEEP_SECONDS  # bounded: a missed wake costs this
    # A tick still due after the pass (its firing failed) is tried again soon, not at once.
    assert pause(int(NOW) - 1, NOW) == RETRY_SECONDS
    assert pause(tick, tick) == RETRY_SECONDS


def test_a_crons_next_tick_as_created_updated_fired_and_ended() -> None:
    """The one home of a cron's next tick (``CronRow``): the worker writes it, the API answers it."""
    hour = 3600
    job = CronCreate("c", None, "0 * * * *", "hi", {"a": 1}, NOW, "j", "alice", True, int(NOW) + 2 * hour)
    cron = CronRow.created(job)
    first = int(datetime(2026, 12, 6, 14, 0, tzinfo=UTC).timestamp())
    assert (cron.next_tick, cron.next_run, cron.owner) == (first, first, "alice")
    assert cron.end_time == int(NOW) + 2 * hour
    # Fired an hour late: the schedule's first after both, not each tick missed.
    assert cron.following(first + hour + 5) == first + 2 * hour
    # Past its end_time its next tick does not fire; an update clearing it fires it again.
    late = dataclasses.replace(cron, next_tick=first + 3 * hour)
    assert late.next_run is None
    assert late.updated(CronUpdate("c", "j2", NOW, clear_end_time=True)).next_run == first + 3 * hour
    assert late.updated(CronUpdate("c", "j3", NOW, end_time=first + 5 * hour)).next_run == first + 3 * hour
    assert late.updated(CronUpdate("c", "j4", NOW, message="yo")).end_time == cron.end_time
    # Disabled: no next run; enabled again, the schedule's first tick after the update.
    off = cron.updated(CronUpdate("c", "j5", NOW, enabled=False))
    assert off.next_run is None and off.next_tick == first
    on = off.updated(CronUpdate("c", "j6", NOW + 3 * hour, enabled=True))
    assert on.next_tick == first + 3 * hour and on.enabled
