"""The Agent Protocol: the LangGraph Agent Server's HTTP API, served on Sophos's own engine.

What the LangGraph SDKs (``langgraph-sdk``, ``@langchain/langgraph-sdk``), agent-chat-ui and
Studio speak, at the root paths they use (``/assistants``, ``/threads``, ``/info``, ``/ok``),
mapped onto what the native routes use: a thread is a conversation, a run is a run (the same
queue, worker, one-run rule, crash semantics and event streams), an assistant is a stored
configuration of the one agent (``agent``, config/'s, is the default).
Nothing here is a second store of threads: a thread created empty is a small Redis record
(:mod:`api.protocol.threads`) until its first run creates its conversation.

Modules: ``status`` (Sophos statuses as the SDK's), ``translate`` (a run's native events as the
Agent Server's stream modes, pure), ``interrupts`` (approvals as langchain's
``HumanInTheLoopMiddleware`` interrupts, and their decisions back, pure), ``state`` (a thread's
state and history in the SDK's shape, read in a reader process), ``assistant`` (the agent's
graph and schemas), ``assistants`` and ``assistant_routes`` (assistants: the service and its
controller), ``threads`` and ``runs`` (the services), ``forks`` (a run from a checkpoint,
and rollbacks, onto Sophos's branches), ``crons`` (schedules of runs: stored, fired and deleted
by the workers; its own controller), ``store`` (the Store's items, long-term memory: its own
controller, on LangGraph's store for the engine), ``routes`` (the controllers, which
only translate), ``errors`` (their error answers). Beside them, each with its own controller
where it has routes: ``modes`` (the step stream modes: ``messages``, ``tasks``, ``checkpoints``,
``debug``, ``events``, pure) and ``messages`` (the message shapes streams send), ``commands``
(what a client may write: ``update_state``'s values, ``command.goto``/``update``, breakpoints;
pure), ``updates`` (``update_state``), ``stateless`` (runs without a thread) and ``prune``
(``threads.prune``). docs/agent-protocol.md is the manual.
"""
