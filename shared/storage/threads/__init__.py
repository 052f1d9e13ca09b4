"""A conversation's thread: the state LangGraph keeps for it and how each side reads it.

``state`` (the graph's state and shape, as the worker runs it), ``branch`` (the path a
conversation follows), ``interrupts`` (a state's pending approvals and their resume), and the
API's reader processes' side: ``source`` (where and how a reader reads), ``decoding`` (the strict
serializer), ``snapshot`` (a state rebuilt without LangGraph's graph runtime), ``history`` (a
whole history in time linear in its length), ``listing`` (a PostgreSQL thread's checkpoints
listed so too, a full copy of the messages fetched only when read); ``pruning`` (what a thread
keeps of its checkpoints, and the rest deleted, by the worker).
"""
