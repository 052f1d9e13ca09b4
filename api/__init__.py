"""The HTTP API: validates and enqueues runs, relays their events as SSE, serves reads.

Never writes the database and never imports LangGraph's runtime. Importing this
package has no side effects; ``python -m api`` is the entry point.

Packages by concern: ``auth`` (who is asking), ``http`` (what every route shares), ``chat``
(submitting and streaming runs), ``conversations`` (reads, exports, rename, delete), ``runs``
(operators' runs and cancel), ``ops`` (health, readiness, metrics), ``protocol`` (the Agent
Protocol). At the top: the app, the process start, its resources, its reads, the web page.
"""
