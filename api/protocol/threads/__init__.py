"""Threads in the SDK's shape: the service (find, create, state, history, update, delete), a
thread's Redis record (records.py) and how a thread is shown (found.py), search and count, what
its routes take (bodies), state and history, update_state, copy and prune."""
