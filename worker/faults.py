"""Test-only fault injection, off unless SOPHOS_FAULT_KILL_AFTER_CHECKPOINT is set.

Some crash windows are too narrow to hit with a signal from outside (for
example: after the final checkpoint, before the outcome is recorded). With
``SOPHOS_FAULT_KILL_AFTER_CHECKPOINT=N`` the worker SIGKILLs itself right after
its Nth checkpoint write since start-up, exactly as ``kill -9`` would.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver


class KillAfterCheckpoints(AsyncSqliteSaver):
    kill_after: int = 0
    written: int = 0

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        result = await super().aput(config, checkpoint, metadata, new_versions)
        self.written += 1
        if self.written == self.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return result
