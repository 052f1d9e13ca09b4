"""The Agent Protocol: the LangGraph Agent Server's HTTP API, served on Sophos's own engine.

What the LangGraph SDKs (``langgraph-sdk``, ``@langchain/langgraph-sdk``), agent-chat-ui and
Studio speak, at the root paths they use (``/assistants``, ``/threads``, ``/info``, ``/ok``),
mapped onto what the native routes use: a thread is a conversation, a run is a run (the same
queue, worker, one-run rule, crash semantics and event streams), an assistant is a stored
configuration of the one agent (``agent``, config/'s, is the default).
Nothing here is a second store of threads: a thread created empty is a small Redis record
(:mod:`api.protocol.threads.service`) until its first run creates its conversation.

By concern:

- ``assistants/``: the agent's graph and schemas (``agent``), the service, its controller;
- ``threads/``: the service, what its routes take (``bodies``), a thread's state and history in
  the SDK's shape (``state``, read in a reader process), ``update_state`` (``updates``),
  ``threads.copy`` (``copies``) and ``threads.prune`` (``prune``);
- ``runs/``: the service, the creation body's checks (``input``), what a client may write
  (``commands``: ``update_state``'s values, ``command.goto``/``update``, breakpoints; pure),
  approvals as langchain's ``HumanInTheLoopMiddleware`` interrupts and their decisions back
  (``interrupts``, pure), a run from a checkpoint and rollbacks onto Sophos's branches (``forks``),
  runs without a thread (``stateless``);
- ``stream/``: a run's native events as the Agent Server's stream modes (``translate`` and
  ``modes``, pure; ``messages``, the message shapes streams send), the relay that sends them
  (``relay``), a thread's stream (``thread``) and the SDK's thread streaming session,
  ``threads.stream`` (``session``: its commands and event streams; ``session_events``, its
  events, pure);
- here: ``routes`` (the controllers, which only translate), ``answers`` (what they share: their
  parameters, their services, the answers that wait for a run), ``errors`` (their error answers),
  ``status`` (Sophos statuses as the SDK's), ``crons`` (schedules of runs: stored, fired and
  deleted by the workers; its own controller), ``store`` (the Store's items, long-term memory:
  its own controller, on LangGraph's store for the engine) ``mcp`` (the agent as an MCP
  server at ``/mcp``: each assistant a tool, a call a run made by the runs' service) and
  ``mcp_mount`` (its mount, which loads it on the first request).

docs/agent-protocol.md is the manual.
"""
