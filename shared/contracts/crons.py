"""Crons (the Agent Protocol's ``client.crons``): schedules, their jobs, their firing's ids.

What both ends need: the API parses a schedule to refuse a bad one (422) and to say when it
fires next; the worker stores a cron (a ``cron_create`` job: the API never writes the
database), deletes one (``cron_delete``) and fires its ticks (worker/schedule/crons/).

A schedule is a cron expression in UTC: five fields (minute hour day-of-month month
day-of-week), or six with seconds first (``*/2 * * * * *``: every two seconds), or one of
``@yearly``, ``@monthly``, ``@weekly``, ``@daily``, ``@hourly``. Each field takes ``*``,
numbers, ranges ``a-b``, steps ``*/n`` and ``a-b/n``, and lists of those; months and week days
take their English names too (``jan``, ``mon``). As in cron, when both day fields are
restricted a day matching either fires. The next fire time is arq's :func:`arq.cron.next_cron`.
A schedule in another time zone (the protocol's ``timezone``, an IANA name) is stored as cron's
``CRON_TZ=<zone> <expression>``: its fields are then that zone's wall-clock time, daylight
saving time included (:meth:`Schedule.parse`).

A tick is the schedule's time that fires, in whole seconds since the epoch. Its run's id is a
UUID made from the cron and the tick (:func:`tick_run_id`): every worker that would fire the
same tick names the same run, so a second submission of it is no second run (worker/schedule/crons/ticks.py).
"""

from __future__ import annotations

import calendar
import dataclasses
import json
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from arq.cron import next_cron
from redis.asyncio import Redis

from shared.errors import BadRequest
from shared.redis.queue import submit_job
from shared.storage.schema import iso_from_timestamp

#: the arq functions that store and delete a cron (worker/schedule/crons/jobs.py)
CRON_CREATE_FUNCTION = "cron_create"
CRON_DELETE_FUNCTION = "cron_delete"
CRON_UPDATE_FUNCTION = "cron_update"
#: the longest schedule text taken
SCHEDULE_MAX_CHARS = 200

_NAMESPACE = uuid.UUID("1b4e28ba-2fa1-11d2-883f-0016d3cca427")
_MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}
_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}
_DAYS = {name: i for i, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
#: the longest each month can be (February: in a leap year)
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _field(
    text: str, name: str, low: int, high: int, names: dict[str, int] | None = None
) -> frozenset[int] | None:
    """The values a field matches; None for ``*`` (any)."""
    if text == "*":
        return None
    values: set[int] = set()
    for part in text.split(","):
        body, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) < 1:
                raise BadRequest(
                    f"schedule: the {name} field's step {step_text!r} must be a whole number of 1 or more"
                )
            step = int(step_text)
        if body == "*":
            start, end = low, high
        elif "-" in body:
            first, _, last = body.partition("-")
            start, end = _value(first, name, low, high, names), _value(last, name, low, high, names)
            if start > end:
                raise BadRequest(f"schedule: the {name} field's range {body!r} runs backwards")
        else:
            start = _value(body, name, low, high, names)
            end = high if step_text else start
        values.update(range(start, end + 1, step))
    return frozenset(values)


def _value(text: str, name: str, low: int, high: int, names: dict[str, int] | None) -> int:
    key = text.lower()
    if names is not None and key in names:
        return names[key]
    if not text.isdigit():
        raise BadRequest(f"schedule: {text!r} is not a value of the {name} field ({low}-{high})")
    number = int(text)
    if not low <= number <= high:
        raise BadRequest(f"schedule: {number} is out of the {name} field's range {low}-{high}")
    return number


@dataclass(frozen=True, slots=True)
class Schedule:
    """A parsed schedule: the values each field matches (None: any). Week days are Python's
    (Monday 0); seconds are {0} for a five-field schedule."""

    #: as stored: the expression, after ``CRON_TZ=<zone> `` when it has a zone
    text: str
    second: frozenset[int]
    minute: frozenset[int] | None
    hour: frozenset[int] | None
    day: frozenset[int] | None
    month: frozenset[int] | None
    weekday: frozenset[int] | None
    #: the IANA time zone its fields are in; None: UTC
    zone: str | None = None

    @property
    def expression(self) -> str:
        """The cron expression, without its zone."""
        return self.text.split(None, 1)[1] if self.text.startswith(_ZONE_PREFIX) else self.text

    @classmethod
    def parse(cls, text: Any, timezone: str | None = None) -> Schedule:
        """The schedule (in ``timezone``, or the zone a ``CRON_TZ=`` prefix names, else UTC), or
        BadRequest naming what is wrong with it."""
        if not isinstance(text, str) or not text.strip():
            raise BadRequest("schedule must be a cron expression, e.g. '0 9 * * *' (UTC)")
        text = text.strip()
        if text.startswith(_ZONE_PREFIX):
            prefix, _, text = text.partition(" ")
            if timezone is not None:
                raise BadRequest("give the time zone once: as timezone or as CRON_TZ=, not both")
            timezone = prefix.removeprefix(_ZONE_PREFIX)
        if len(text) > SCHEDULE_MAX_CHARS:
            raise BadRequest(f"schedule must be at most {SCHEDULE_MAX_CHARS} characters")
        zone = zone_of(timezone)
        if zone is not None:
            return cls._parse(text, zone, f"{_ZONE_PREFIX}{zone} {text}")
        return cls._parse(text, None, text)

    @classmethod
    def _parse(cls, text: str, zone: str | None, stored: str) -> Schedule:
        expression = _MACROS.get(text.strip().lower(), text)
        fields = expression.split()
        if len(fields) not in (5, 6):
            raise BadRequest(
                f"schedule {text!r} has {len(fields)} fields: it takes 5 (minute hour day month weekday)"
                " or 6 (second first)"
            )
        second_text = fields.pop(0) if len(fields) == 6 else "0"
        minute, hour, day, month, weekday = fields
        days = _field(weekday, "day-of-week", 0, 7, _DAYS)
        schedule = cls(
            text=stored,
            zone=zone,
            second=_field(second_text, "second", 0, 59) or frozenset(range(60)),
            minute=_field(minute, "minute", 0, 59),
            hour=_field(hour, "hour", 0, 23),
            day=_field(day, "day-of-month", 1, 31),
            month=_field(month, "month", 1, 12, _MONTHS),
            # cron's 0 and 7 are Sunday; Python's Monday is 0
            weekday=None if days is None else frozenset((d + 6) % 7 for d in days),
        )
        if schedule.day is not None and schedule.weekday is None and not schedule._day_exists():
            raise BadRequest(f"schedule {text!r} never fires: no month it names has such a day")
        return schedule

    def _day_exists(self) -> bool:
        months = self.month if self.month is not None else range(1, 13)
        return any(d <= _MONTH_DAYS[m - 1] for m in months for d in (self.day or ()))

    def next_after(self, ts: float) -> int:
        """The first tick strictly after ``ts`` (seconds since the epoch), in whole seconds."""
        where: tzinfo = ZoneInfo(self.zone) if self.zone is not None else UTC
        previous = datetime.fromtimestamp(int(ts), where)
        options: dict[str, Any] = {
            "month": _arg(self.month), "hour": _arg(self.hour), "minute": _arg(self.minute),
            "second": _arg(self.second), "microsecond": 0,
        }
        if self.day is not None and self.weekday is not None:
            # cron's rule: either day field matching is enough
            candidates = [next_cron(previous, **options, weekday=_arg(self.weekday))]
            if self._day_exists():
                candidates.append(next_cron(previous, **options, day=_arg(self.day)))
            return int(min(candidates).timestamp())
        found = next_cron(previous, **options, day=_arg(self.day), weekday=_arg(self.weekday))
        return int(found.timestamp())


_ZONE_PREFIX = "CRON_TZ="


def zone_of(timezone: Any) -> str | None:
    """An IANA time zone's name, checked; None for none, and for UTC (the default)."""
    if timezone is None or timezone in ("UTC", "Etc/UTC"):
        return None
    if not isinstance(timezone, str) or not timezone or len(timezone) > 64 or timezone.startswith("/"):
        raise BadRequest("timezone must be an IANA time zone name, e.g. 'Europe/Paris'")
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise BadRequest(f"timezone {timezone[:64]!r} is not a time zone this server knows") from None
    return timezone


def _arg(values: frozenset[int] | None) -> set[int] | None:
    return None if values is None else set(values)


def tick_run_id(cron_id: str, tick: int) -> str:
    """The id of the run a tick fires: the same for every worker that fires it."""
    return str(uuid.uuid5(_NAMESPACE, f"cron:{cron_id}:{tick}"))


def tick_thread_id(cron_id: str, tick: int) -> str:
    """The new thread of a tick of a cron without a thread."""
    return str(uuid.uuid5(_NAMESPACE, f"cron-thread:{cron_id}:{tick}"))


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


# --- the jobs the API enqueues ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class CronCreate:
    """Store a cron (``cron_create``); safe twice: a cron already stored is left as it is."""

    cron_id: str
    thread_id: str | None
    schedule: str
    message: str
    metadata: dict[str, Any]
    created_at: float
    job_id: str
    #: whose cron it is: its runs are theirs
    owner: str = "local"
    #: False: stored, and never fired until an update enables it
    enabled: bool = True
    #: no tick after this (seconds since the epoch) fires; None: none
    end_time: int | None = None
    #: ``on_run_completed: delete``: each tick's new thread is deleted once its run has ended
    delete_threads: bool = False


@dataclass(frozen=True, slots=True)
class CronUpdate:
    """Change a cron (``cron_update``): each field given replaces the stored one (None: kept).
    A new schedule, or a cron enabled, fires next at its schedule's first tick after
    ``updated_at`` (no tick missed while it was disabled fires). Safe twice."""

    cron_id: str
    job_id: str
    updated_at: float
    schedule: str | None = None
    message: str | None = None
    metadata: dict[str, Any] | None = None
    enabled: bool | None = None
    #: a new ``end_time`` (None: kept, unless ``clear_end_time``)
    end_time: int | None = None
    #: True: the cron's ``end_time`` is removed (the SDK's ``end_time=None``)
    clear_end_time: bool = False
    #: a new ``on_run_completed`` (True: ``delete``; None: kept)
    delete_threads: bool | None = None


@dataclass(frozen=True, slots=True)
class CronDelete:
    """Delete a cron (``cron_delete``); safe twice: a cron already gone stays gone."""

    cron_id: str
    job_id: str


def cron_done_key(job_id: str) -> str:
    """List the worker pushes a cron job's outcome to (``done`` or ``failed: ...``), briefly kept."""
    return f"sophos:cron-done:{job_id}"


async def submit_cron_job(redis: Redis, function: str, job: CronCreate | CronUpdate | CronDelete) -> None:
    """Enqueue ``job`` and wake a worker, atomically (shared/redis/queue.py ``submit_job``)."""
    await submit_job(redis, function, job.job_id, job, time.time())


# --- the stored cron -------------------------------------------------------------

CRON_COLUMNS = (
    "id, thread_id, schedule, message, metadata, created_at, updated_at, next_tick,"
    " fired, skipped, last_tick, last_outcome, last_run_id, owner, enabled, end_time, delete_threads"
)


@dataclass(frozen=True, slots=True)
class CronRow:
    id: str
    thread_id: str | None
    schedule: str
    message: str
    metadata: str
    created_at: str
    updated_at: str
    next_tick: int
    fired: int
    skipped: int
    last_tick: int | None
    last_outcome: str | None
    last_run_id: str | None
    owner: str = "local"
    #: False: its ticks do not fire
    enabled: bool = True
    #: no tick after this (seconds since the epoch) fires; None: none
    end_time: int | None = None
    #: ``on_run_completed: delete``: each tick's new thread is deleted once its run has ended
    delete_threads: bool = False

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> CronRow:
        return cls(
            str(row[0]), row[1], str(row[2]), str(row[3]), str(row[4]), str(row[5]), str(row[6]),
            int(row[7]), int(row[8]), int(row[9]), None if row[10] is None else int(row[10]),
            row[11], row[12], str(row[13]), bool(row[14]), None if row[15] is None else int(row[15]),
            bool(row[16]),
        )

    # The one home of a cron's next tick: what a create stores, what an update changes, what
    # follows a tick fired. The worker writes these (worker/schedule/crons/); the API answers
    # them while a worker has not taken the job yet (api/protocol/crons.py).

    @classmethod
    def created(cls, job: CronCreate) -> CronRow:
        """The cron a create stores: its first tick the schedule's first after its creation."""
        at = iso_from_timestamp(job.created_at)
        return cls(
            job.cron_id, job.thread_id, job.schedule, job.message, json.dumps(job.metadata), at, at,
            Schedule.parse(job.schedule).next_after(job.created_at), 0, 0, None, None, None, job.owner,
            job.enabled, job.end_time, job.delete_threads,
        )

    def updated(self, job: CronUpdate) -> CronRow:
        """The cron once ``job`` changed it. A new schedule, or the cron enabled, fires next at the
        schedule's first tick after the update: no tick missed while it was disabled fires."""
        schedule = job.schedule if job.schedule is not None else self.schedule
        enabled = self.enabled if job.enabled is None else job.enabled
        restart = job.schedule is not None or (enabled and not self.enabled)
        end_time = self.end_time if job.end_time is None else job.end_time
        return dataclasses.replace(
            self, schedule=schedule, enabled=enabled,
            message=job.message if job.message is not None else self.message,
            metadata=self.metadata if job.metadata is None else json.dumps(job.metadata),
            updated_at=iso_from_timestamp(job.updated_at),
            next_tick=Schedule.parse(schedule).next_after(job.updated_at) if restart else self.next_tick,
            end_time=None if job.clear_end_time else end_time,
            delete_threads=self.delete_threads if job.delete_threads is None else job.delete_threads,
        )

    def following(self, now: float) -> int:
        """The tick after the one due (``next_tick``), fired at ``now``: the schedule's first after
        both (ticks missed meanwhile are not fired one by one)."""
        return Schedule.parse(self.schedule).next_after(max(now, self.next_tick))

    @property
    def next_run(self) -> int | None:
        """The tick it fires next; None: disabled, or past its ``end_time``."""
        ended = self.end_time is not None and self.next_tick > self.end_time
        return self.next_tick if self.enabled and not ended else None


#: the SQL condition of a cron whose next tick fires (:attr:`CronRow.next_run`), for the tickers
FIRES = "enabled = 1 AND (end_time IS NULL OR next_tick <= end_time)"
