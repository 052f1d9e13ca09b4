"""The worker: owns the database's writes, runs the agent graph for arq jobs.

Packages by concern: ``run`` (a run's life, from its record to its ending), ``agent`` (the
graph and the model), ``tools`` (MCP sessions and the ledger of tool effects), ``schedule``
(crons, webhooks, deadlines), ``upkeep`` (sweep, retention, deletion, renaming, copying). At the
top: the process start, the arq entry points, the resources held for the worker's life, its
writes to the application tables, the single-writer lock.
"""
