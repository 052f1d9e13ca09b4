"""The Redis keys the API and the worker share, and how long each is kept.

The scripts that run on these keys are in :mod:`shared.redis.scripts`; arq's own keys (its job
records, in-progress markers and retries) are named here too, as arq 0.28 lays them out.
"""

from __future__ import annotations

import json

QUEUE_NAME = "sophos:queue"
#: sorted sets run_id -> enqueue time (ms): the runs queued and not yet taken by a worker, what a
#: ``/metrics`` scrape counts with ZCARD (api/runs/queue.py ``figures``): ``QUEUED_READY`` the runs
#: waiting for a worker, ``QUEUED_BEHIND`` those waiting behind another run of their conversation
#: (``waiting_key``). Kept by the scripts that move a run (shared/redis/scripts/
#: ``QUEUED_INDEX_LUA``): accepted, its turn come, taken, ended. A run whose job vanished otherwise
#: (arq dropped it, its record expired) is pruned from the oldest end by the scrape.
QUEUED_READY = "sophos:queued:ready"
QUEUED_BEHIND = "sophos:queued:behind"
#: hash conversation_id -> run_id of its queued or running run; HSETNX is the lock
#: that makes "one run per conversation" atomic across API processes.
ACTIVE_RUNS = "sophos:active"
#: list the submit script pushes to, so an idle worker blocked on BLPOP wakes at once
WAKE_LIST = "sophos:wake"
#: key with a short TTL, rewritten by every live worker's beat (the last writer's):
#: {id, host, pid, started_at, beat_at, ...}. The aggregate older readers know; each
#: worker's own is ``worker_heartbeat_key``.
WORKER_HEARTBEAT = "sophos:worker:heartbeat"
#: sorted set worker id -> Redis time of its last beat; trimmed of members older than the
#: heartbeat's TTL at each beat, and expiring with it: the workers that may be alive
WORKERS = "sophos:workers"


def worker_heartbeat_key(worker_id: str) -> str:
    """One worker's heartbeat (the body of ``WORKER_HEARTBEAT``), with the same short TTL."""
    return f"{WORKER_HEARTBEAT}:{worker_id}"


def run_key(run_id: str) -> str:
    """Hash describing a queued run (conversation, kind, title, enqueued_at, owner)."""
    return f"sophos:run:{run_id}"


#: Hash: owner -> when (ms) the worker last took one of their runs, what the fair order of the
#: queue reads (worker/queue/fair.py): the least recently served owner goes first.
OWNERS_TAKEN = "sophos:owners-taken"


def user_runs_key(owner: str) -> str:
    """Set: ``owner``'s runs queued or running, what ``USER_MAX_ACTIVE_RUNS`` counts (a run
    leaves it when it ends, or when the submit script finds its job gone: SUBMIT_LUA)."""
    return f"sophos:user-runs:{owner}"


#: How long a request's ``Idempotency-Key`` keeps its first answer.
IDEMPOTENCY_TTL_SECONDS = 24 * 3600


def idempotency_key(key: str, owner: str = "local") -> str:
    """String: the first answer to ``owner``'s ``POST /api/chat`` with this ``Idempotency-Key``
    (a key is its user's: another user's same key is another key). A NUL, which neither a user
    name nor a key can hold, keeps ``a:b`` + ``c`` apart from ``a`` + ``b:c``."""
    return f"sophos:idem:{owner}\x00{key}"


def conversation_deleted_key(conversation_id: str) -> str:
    """String, kept ``IDEMPOTENCY_TTL_SECONDS``: the conversation was deleted.

    Written by the delete (worker/upkeep/deletion.py) before it frees the conversation: an
    ``Idempotency-Key`` answer naming it is then refused, not replayed (api/chat/idempotency.py).
    """
    return f"sophos:conversation-deleted:{conversation_id}"


def events_key(run_id: str) -> str:
    """Redis Stream holding the run's events; entry ids are ``<n>-0``."""
    return f"sophos:events:{run_id}"


#: How long an API process's ``feeds_wake_key`` outlives its last wake.
FEEDS_WAKE_TTL_SECONDS = 3600


def feeds_wake_key(process: str) -> str:
    """Redis Stream of one entry: an API process writes it when it starts watching another run, so
    that its one blocking ``XREAD`` of every watched run (api/chat/feedreader.py), which reads this
    stream too, returns and reads the new run as well. Kept ``FEEDS_WAKE_TTL_SECONDS``."""
    return f"sophos:feeds-wake:{process}"


#: key without expiry, rewritten with each heartbeat: the last beat survives the worker
WORKER_LAST_BEAT = "sophos:worker:last-beat"
#: sorted set run_id -> enqueue time (ms) of the runs cancelled while queued (and of the runs
#: refused when their turn came, worker/run/turns.py); their ``run_key`` hash (with ``status``
#: and ``cancelled_at`` or ``failed_at``) is the record, kept ``CANCELLED_RETENTION_SECONDS``.
CANCELLED_RUNS = "sophos:cancelled"
CANCELLED_RETENTION_SECONDS = 7 * 24 * 3600


def cancelled_run_key(conversation_id: str) -> str:
    """String: the conversation's last run cancelled while queued, kept ``CANCELLED_RETENTION_SECONDS``.

    That run never reaches SQLite, so the conversation's row still names the run
    before it; the SSE relay looks here to stream the newer of the two.
    """
    return f"sophos:cancelled-run:{conversation_id}"


def waiting_key(conversation_id: str) -> str:
    """List of the conversation's runs accepted behind its active run (``multitask_strategy``
    ``enqueue``), oldest first: each claims the conversation in this order when the worker takes
    its job (worker/run/turns.py). Kept no longer than its newest run's job record."""
    return f"sophos:waiting:{conversation_id}"


def taken_key(run_id: str) -> str:
    """Which worker took the run's job (PostgreSQL, several workers): set before its run is
    recorded, so a live worker's sweep can free the conversation of a run whose taker died
    in between (arq's in-progress marker would hold it for a day)."""
    return f"sophos:taken:{run_id}"


#: How long the record of who took a run is kept: past any wait for its row.
TAKEN_SECONDS = 3600


def cancel_key(run_id: str) -> str:
    """Set by the API to ask the worker to stop a started run (read again after a crash): JSON
    ``{"requested_at": seconds, "by": user}``, ``by`` the user who asked (:func:`cancelled_by`)."""
    return f"sophos:cancel:{run_id}"


def cancelled_by(marker: str | bytes | None) -> str | None:
    """Who asked, as a ``cancel_key`` marker says; None when it does not (or is not JSON: a marker
    an older API wrote, or none)."""
    try:
        body = json.loads(marker) if marker else None
    except ValueError:
        return None
    by = body.get("by") if isinstance(body, dict) else None
    return by if isinstance(by, str) and by else None


#: pub/sub channel the API publishes a run's id on, with ``cancel_key``: the worker,
#: subscribed for its life, cuts the run at once
CANCEL_CHANNEL = "sophos:cancels"


def thread_runs_channel(conversation_id: str) -> str:
    """Pub/sub channel the submit script publishes each run accepted for the conversation on (its
    id): a thread's stream (``threads.join_stream``, api/protocol/stream/thread.py) waits on it."""
    return f"sophos:thread-runs:{conversation_id}"
def model_call_key(conversation_id: str) -> str:
    """The task id of the conversation's last model call started (worker/agent/model_calls.py)."""
    return f"sophos:model-call:{conversation_id}"


#: how long a model call's mark is kept: a resume later than that is not counted as a repeat
#: (as long as the longest-kept key, a cancelled run's record: what Redis holds stays bounded)
MODEL_CALL_MARK_TTL = 7 * 24 * 3600


def progress_key(run_id: str) -> str:
    """Hash the worker keeps while a run is running: {node, step, started_at, updated_at}."""
    return f"sophos:progress:{run_id}"


#: sorted set thread id -> creation time (ms) of the threads made by ``POST /threads`` (the
#: Agent Protocol, api/protocol/): the ones with no conversation yet are listed from here
PROTOCOL_THREADS = "sophos:protocol:threads"


def protocol_thread_key(thread_id: str) -> str:
    """Hash of a thread made by ``POST /threads``: {created_at, metadata (JSON), owner, and ``ttl``
    (minutes) when its creator gave one}.

    A thread created empty has no conversation until its first run: this record is how it
    exists meanwhile, and where its metadata stays after (the database has no column for it).
    Deleted with its conversation (worker/upkeep/deletion.py) or by ``DELETE /threads/{id}``.
    """
    return f"sophos:protocol:thread:{thread_id}"


#: sorted set thread id -> when (ms) the worker looks at whether the thread has expired: a thread
#: made by ``POST /threads`` with a ``ttl``, or still empty (worker/upkeep/expiry.py)
PROTOCOL_THREAD_EXPIRY = "sophos:protocol:thread-expiry"


def empty_threads_key(owner: str) -> str:
    """Sorted set of the ids of ``owner``'s threads created empty that have had no run yet
    (score: creation, ms): what ``USER_MAX_EMPTY_THREADS`` counts (api/protocol/threads/records.py)."""
    return f"sophos:protocol:empty-threads:{owner}"


def protocol_run_key(run_id: str) -> str:
    """Hash of a run created through the Agent Protocol: {metadata, stream_mode} (JSON), kept
    ``PROTOCOL_RUN_RETENTION_SECONDS``; a run without one shows the defaults."""
    return f"sophos:protocol:run:{run_id}"


PROTOCOL_RUN_RETENTION_SECONDS = 7 * 24 * 3600


def arq_job_key(run_id: str) -> str:
    return f"arq:job:{run_id}"


def arq_in_progress_key(run_id: str) -> str:
    return f"arq:in-progress:{run_id}"


def arq_retry_key(run_id: str) -> str:
    return f"arq:retry:{run_id}"


def deleted_key(claim: str) -> str:
    """List the worker pushes the delete's outcome to (``deleted`` or ``failed: ...``), briefly kept."""
    return f"sophos:deleted:{claim}"


def copied_key(job_id: str) -> str:
    """List the worker pushes a thread copy's outcome to (``copied``, ``gone`` or ``failed: ...``)."""
    return f"sophos:copied:{job_id}"


def renamed_key(job_id: str) -> str:
    """List the worker pushes a rename's outcome to (``renamed``, ``gone`` or ``failed: ...``)."""
    return f"sophos:renamed:{job_id}"


#: how long a prune's progress is kept after its last batch
PRUNE_PROGRESS_TTL_SECONDS = 86_400


def prune_key(job_id: str) -> str:
    """Hash of a prune's progress (worker/upkeep/pruning.py): ``state`` (``running``, ``done`` or
    ``failed: ...``), ``conversations``, ``skipped``, ``deleted``, ``kept``, ``batches``,
    ``started_at``, ``finished_at``."""
    return f"sophos:prune:{job_id}"
