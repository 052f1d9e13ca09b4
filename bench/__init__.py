"""Sophos benchmark suite: what durability costs, measured against the floor.

``python -m bench`` starts its own Redis, a zero-latency fake model, the real worker
and API, and measures each figure of issue 6 side by side with its floor (see
``bench/RESULTS.md`` for the workload, the figures and the latest numbers).
``python -m bench --quick`` is the smoke mode: a few runs per figure, never a
judgement on speed.
"""
