"""The agent: its graph, its model, and the checks and counts around model calls."""
