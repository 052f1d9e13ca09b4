"""The tool-call ledger's states, written by the worker (worker/tools/ledger/) and read by the
API (api/conversations/ledger_view.py): one spelling for both.

A row is an ``intent`` from just before its call is sent until its outcome is recorded
(``done``); a call made as an MCP task also has the task's id and its last known state, one of
the protocol's (``working``, ``completed``, ``failed``, ``cancelled``, …) or
:data:`TASK_FORGOTTEN`.
"""

from __future__ import annotations

from typing import Final

#: the call may have been sent; its outcome is not recorded
INTENT: Final = "intent"
#: the call's outcome is recorded
DONE: Final = "done"
#: the ``task_state`` of a call whose server no longer knows its task
TASK_FORGOTTEN: Final = "forgotten"
