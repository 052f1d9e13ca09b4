"""The agent: its graph, its model, the checks and counts around model calls, and its memory in
the Store (``memory``)."""
