"""One error tree for the service. The API maps it to HTTP in one place.

    SophosError                 code, message, http status
    ├── BadRequest              400 BAD_REQUEST
    ├── Unauthorized            401 UNAUTHORIZED
    ├── Forbidden               403 FORBIDDEN
    ├── NotFound                404 NOT_FOUND
    ├── SessionInProgress       409 SESSION_IN_PROGRESS
    ├── RunNotResumable         409 RUN_NOT_RESUMABLE
    ├── ApprovalPending         409 APPROVAL_PENDING
    ├── NoApprovalPending       409 NO_APPROVAL_PENDING
    ├── RunFinished             409 RUN_FINISHED
    ├── UserExists              409 USER_EXISTS (sophos users add of a user with a key in force)
    ├── ThreadExists            409 THREAD_EXISTS (the Agent Protocol: POST /threads, if_exists=raise)
    ├── AssistantExists         409 ASSISTANT_EXISTS (POST /assistants of an id taken, if_exists=raise)
    ├── DefaultAssistant        409 DEFAULT_ASSISTANT (the default, `agent`, is config/'s: not changed)
    ├── WaitingListFull         409 WAITING_LIST_FULL (the Agent Protocol: enqueue on a full thread)
    ├── TooManyEmptyThreads     409 TOO_MANY_EMPTY_THREADS (POST /threads: USER_MAX_EMPTY_THREADS)
    ├── PayloadTooLarge         413 PAYLOAD_TOO_LARGE
    ├── IdempotencyKeyReused    422 IDEMPOTENCY_KEY_REUSED
    ├── NotForkable             422 NOT_FORKABLE (an edit of a message not the user's)
    ├── InvalidTitle            422 INVALID_TITLE (a rename to a blank or too long title)
    ├── RateLimited             429 RATE_LIMITED (Retry-After when known)
    │   └── TooManyActiveRuns   429 TOO_MANY_ACTIVE_RUNS (USER_MAX_ACTIVE_RUNS, with Retry-After)
    ├── QueueUnavailable        503 QUEUE_UNAVAILABLE
    ├── DatabaseUnavailable     503 DATABASE_UNAVAILABLE
    ├── ReadTimedOut            503 READ_TIMEOUT
    └── NotReady                503 NOT_READY
"""

from __future__ import annotations


class SophosError(Exception):
    code = "INTERNAL_ERROR"
    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(SophosError):
    code = "BAD_REQUEST"
    status = 400


class Unauthorized(SophosError):
    code = "UNAUTHORIZED"
    status = 401


class Forbidden(SophosError):
    code = "FORBIDDEN"
    status = 403


class NotFound(SophosError):
    code = "NOT_FOUND"
    status = 404


class SessionInProgress(SophosError):
    code = "SESSION_IN_PROGRESS"
    status = 409


class RunNotResumable(SophosError):
    code = "RUN_NOT_RESUMABLE"
    status = 409


class ApprovalPending(SophosError):
    """A message or resume for a conversation whose tool calls wait for a decision."""

    code = "APPROVAL_PENDING"
    status = 409


class NoApprovalPending(SophosError):
    """Decisions for a conversation that waits for none (never did, or already decided)."""

    code = "NO_APPROVAL_PENDING"
    status = 409


class RunFinished(SophosError):
    code = "RUN_FINISHED"
    status = 409


class UserExists(SophosError):
    code = "USER_EXISTS"
    status = 409


class ThreadExists(SophosError):
    code = "THREAD_EXISTS"
    status = 409


class AssistantExists(SophosError):
    code = "ASSISTANT_EXISTS"
    status = 409


class DefaultAssistant(SophosError):
    """A delete, update or version change of ``agent``, the assistant made from config/."""

    code = "DEFAULT_ASSISTANT"
    status = 409


class WaitingListFull(SophosError):
    """The Agent Protocol: a run enqueued on a thread that has as many waiting as it may hold."""

    code = "WAITING_LIST_FULL"
    status = 409


class TooManyEmptyThreads(SophosError):
    """The Agent Protocol: a thread created empty by a user who holds ``USER_MAX_EMPTY_THREADS``."""

    code = "TOO_MANY_EMPTY_THREADS"
    status = 409


class NotForkable(SophosError):
    """An edit named a message that is not the user's, or a regenerate found no user message to
    answer again (Branches)."""

    code = "NOT_FORKABLE"
    status = 422


class InvalidTitle(SophosError):
    """A rename whose title is blank or longer than ``TITLE_MAX_CHARS`` once whitespace is collapsed."""

    code = "INVALID_TITLE"
    status = 422


class PayloadTooLarge(SophosError):
    code = "PAYLOAD_TOO_LARGE"
    status = 413


class IdempotencyKeyReused(SophosError):
    """An ``Idempotency-Key`` sent again with a different request."""

    code = "IDEMPOTENCY_KEY_REUSED"
    status = 422


class RateLimited(SophosError):
    code = "RATE_LIMITED"
    status = 429

    def __init__(self, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        #: seconds until a retry can succeed, sent as ``Retry-After``
        self.retry_after = retry_after


class TooManyActiveRuns(RateLimited):
    """The caller has ``USER_MAX_ACTIVE_RUNS`` runs queued or running already."""

    code = "TOO_MANY_ACTIVE_RUNS"


class QueueUnavailable(SophosError):
    code = "QUEUE_UNAVAILABLE"
    status = 503


class DatabaseUnavailable(SophosError):
    code = "DATABASE_UNAVAILABLE"
    status = 503


class ReadTimedOut(SophosError):
    """A thread read or export took longer than READ_TIMEOUT; its reader process was stopped."""

    code = "READ_TIMEOUT"
    status = 503


class ConversationUnreadable(SophosError):
    """The conversation's saved state is there but cannot be decoded (damaged, or refused:
    a checkpoint in a format the service never writes, such as pickle)."""

    code = "CONVERSATION_UNREADABLE"
    status = 500


class NotReady(SophosError):
    code = "NOT_READY"
    status = 503
