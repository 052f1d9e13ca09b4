"""Crons: storing and deleting them (jobs the API enqueues: jobs.py), and firing their ticks
(one tick: ticks.py; when a ticker looks: ticker.py).

**Exactly once per tick, across any number of workers.** Every worker's ticker looks for due
crons (a pass). A tick is fired in three steps, and no Redis round trip happens inside a
transaction (a Redis that stalls would hold the database's write lock, and with it every run's
checkpoint and ledger writes):

1. *claimed*: a conditional update moves the cron's ``next_tick`` on from the tick it read
   (``WHERE next_tick = <tick>``) and marks the tick ``submitting``, which only one worker's update
   can do (PostgreSQL locks the row: a second worker's update waits for the first to commit, then
   matches nothing; SQLite has one writer); committed at once;
2. *submitted*: the run is submitted to Redis (or the tick found skipped);
3. *recorded*: what the tick did (``fired``, ``skipped``) replaces ``submitting``.

Redis failing at 2 puts the tick back as it was (due again: the next pass fires it). A worker
that dies between 1 and 3 leaves the tick ``submitting``; a pass submits it again once it has
been so for :data:`~.ticks.UNSUBMITTED_SECONDS`. Either way the run is the same: its id comes from the
cron and the tick (shared/contracts/crons.py), so a second submission of a run already accepted
finds the thread held by that same run and counts as fired, and a run already recorded is never
executed twice (``RunService.execute``). A cron has one tick in flight at a time: its next tick
fires once the one ``submitting`` is recorded.

**The one-run rule.** A tick is submitted like any run (``shared.redis.queue.submit``: the atomic
claim of the thread), checked as a message on ``POST /api/chat`` is. A thread held by another
run, or waiting for a decision (an approval), is not run on (one with a run to resume takes the
message, as it would from a user): the tick is recorded ``skipped`` (the cron's ``skipped``
count and last outcome, the log line ``cron.tick_skipped``, the counter
``sophos_cron_ticks_total{outcome="skipped"}``).

**Ticks missed while no worker ran** are fired once, late, by the first pass that finds them:
the tick fired is the first one missed, and the next is the schedule's first after now, so a
cron that missed many ticks fires once, not once per missed tick.

**When a ticker looks.** Not on a fixed beat, which queried the database twice a second per
worker, crons or none: after each pass it sleeps until the earliest next tick of all crons
(:func:`~.ticker.pause`), at most :data:`~.ticker.LONGEST_SLEEP_SECONDS`, and a cron stored wakes
it at once. The ``cron_create`` job publishes on :data:`~.jobs.CRONS_CHANNEL` after its commit,
and every worker's ticker is subscribed (worker/subscription.py). Pub/sub rather than only waking
the ticker of the worker that ran the job: every worker is then ready for the new cron's first
tick, and if that one worker is killed the next second, the tick still fires on time instead of up
to the longest sleep late, and two workers contend for every tick as for those of crons already
stored. A subscription (the first, and each one after a lost connection) starts a pass too, for a
cron stored while it was away; the bound on the sleep covers a publication lost otherwise (Redis
down just after the commit). A deleted cron wakes no one: a ticker asleep until its tick wakes to
a pass that finds nothing. A tick still due after a pass (its firing failed, or more than
:data:`~.ticker.BATCH` were due) is tried again :data:`~.ticker.RETRY_SECONDS` later.
"""
