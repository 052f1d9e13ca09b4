"""The ledger of tool effects: where a tool call is recorded before and after it acts.

A tool call is the one part of a run that acts on the world, and LangGraph's own record of
it is not enough: it saves a finished task's writes in the background (``put_writes`` is not
awaited even with ``durability="sync"``, langgraph#8039 / #8234, checked on langgraph
1.2.24), so a worker killed just after a call returned can lose the record and run the call
again on resume. The ledger (table ``tool_calls``, shared/storage/schema.py migration 5) decides
instead. For each call of an assistant message, in :meth:`~worker.tools.ledger.calls.Ledger.run`:

1. **Intent**, committed and awaited before the request leaves: conversation, run, message,
   tool call id, tool, arguments, idempotency key, attempt number. On PostgreSQL the same
   transaction checks the run's lease (:func:`shared.storage.leases.hold_lease`): a worker
   that lost its run sends nothing.
2. The request, with the key in its ``_meta`` as ``"sophos/idempotency-key"``
   (:data:`~worker.tools.ledger.attempt.IDEMPOTENCY_META_KEY`; worker/tools/mcp.py reads
   :func:`~worker.tools.ledger.attempt.request_meta`).
3. **Outcome** (the result or the error the model is given), committed before the call's
   task returns. Not fenced: it records a fact, whoever holds the run now.

A call whose outcome is recorded is answered from the ledger on every later attempt, and
never sent again, whatever LangGraph's writes say.

The key is made once per call (a random UUID, on its first intent) and kept on every attempt;
every other call gets another. A tool server can deduplicate with it (docs: tool authors).

A call with an intent and no outcome (the worker died while it was sent, or between its
result and the outcome's commit) is *uncertain*: it may have acted. On the next attempt it
is sent again, with the same key, only when its tool is safe to repeat (the MCP tool's
``readOnlyHint`` or ``idempotentHint``, or ``safeToRepeat`` in ``mcp.json``:
worker/tools/mcp.py). Any other uncertain call is put to a person: its task raises an
interrupt whose request has ``"kind": "uncertain"`` (one per call, each task its own, so the
run ends ``waiting`` with every such call listed and the finished siblings kept), and the
decision decides: approve sends it again with the same key, edit sends new arguments under a
new key, reject never sends it (the model is told it may or may not have taken effect). Nothing
before ``interrupt()`` acts: on resume the task runs again from its start and reads the same row.

A call whose answer did not come (it timed out, or its transport was lost after it was sent: the
tool's transport says so through :func:`~worker.tools.ledger.attempt.unanswered`) is the same case,
met without a crash: it is never an error the model would retry under a new tool call id, so a new
key. A tool safe to repeat is sent again at once with the same key
(:data:`~worker.tools.ledger.calls.UNANSWERED_RESENDS` times; then its error is the outcome,
repeating it being harmless); any other call is put to a person as above, in the run that sent it.
One sent again on that decision that gets no answer again is not asked about twice (a task asks
once: on resume it replays its answers from the start): the model is told it may have acted.

A call made as an MCP task (worker/tools/tasks.py: its server and its tool support tasks) has its
task id committed beside its intent as soon as the server gives it, and each state the server
reports after (:func:`~worker.tools.ledger.attempt.task_state`; migration 13). Such a call with an
intent and no outcome is not uncertain while its server knows the task: the next attempt asks the
server (``ask``) before anything else, and the task's result, waited for if it is still working, is
the call's outcome (counted as :data:`~shared.redis.metrics.TOOL_CALLS_FROM_TASK`). Only a task the
server no longer knows (its state recorded as :data:`~shared.contracts.ledger.TASK_FORGOTTEN`),
or a server that cannot be asked, leaves the call uncertain, handled as above. A crash between the
request and the task id's commit leaves an intent without a task id: uncertain, like any call.

Which module holds what:

- ``records.py``: the table. A call's row (:class:`~worker.tools.ledger.records.CallRef`,
  :class:`~worker.tools.ledger.records.Entry`, its states), its writes (intent, another attempt,
  task, outcome) and its reads (a row; a recorded result as the model's tool message).
- ``attempt.py``: the request being made, in a context variable: the key in its ``_meta``, and
  what the tool's transport tells the ledger while it is made (no answer came; the task it is).
  The one part worker/tools/mcp.py imports.
- ``uncertain.py``: the question put to a person about a call that may have run: the interrupt's
  request, the decision found in the resume value, what the model is told.
- ``calls.py``: :class:`~worker.tools.ledger.calls.Ledger`, the records plus each call's way
  through them (:meth:`~worker.tools.ledger.calls.Ledger.run`): answered, asked of its task, sent
  again, asked about, sent; and its span, metrics, logs and fault points.
"""
