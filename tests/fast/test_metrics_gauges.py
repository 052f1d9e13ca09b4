"""Gauges /metrics builds from the workers' heartbeats, without a process."""

from __future__ import annotations

import json

from api.ops.metrics import Figures, SharedStateCollector
from shared.redis.liveness import Liveness, parse_beat


def beat(**fields: object) -> str:
    return json.dumps({"id": "h:1:ab", "pid": 1, "started_at": 100.0, "beat_at": 110.0, **fields})


def gauge(figures: Figures, name: str) -> float | None:
    for family in SharedStateCollector(figures).collect():
        if family.name == name:
            return float(family.samples[0].value)
    return None


def test_a_beat_says_how_many_outcomes_its_worker_keeps_for_a_retry() -> None:
    parsed = parse_beat(beat(deferred=2))
    assert parsed is not None and parsed.deferred_outcomes == 2
    older = parse_beat(beat())  # a worker from before the field
    assert older is not None and older.deferred_outcomes == 0


def test_outcomes_deferred_adds_up_the_live_workers_and_is_left_out_without_redis() -> None:
    beats = tuple(b for raw in (beat(deferred=2), beat(deferred=1), beat()) if (b := parse_beat(raw)))
    alive = Figures(liveness=Liveness(alive=True, beat=beats[0], workers=beats), now=111.0)
    assert gauge(alive, "sophos_outcomes_deferred") == 3
    none_alive = Figures(liveness=Liveness(alive=False, beat=beats[0]), now=200.0)
    assert gauge(none_alive, "sophos_outcomes_deferred") == 0
    assert gauge(Figures(now=111.0), "sophos_outcomes_deferred") is None
