"""The HTTP API: validates and enqueues runs, relays their events as SSE, serves reads.

Never writes the database and never imports LangGraph's runtime. Importing this
package has no side effects; ``python -m api`` is the entry point.
"""
