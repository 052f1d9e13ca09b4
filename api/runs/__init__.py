"""Runs for operators: the list, one run, its cancel, and what only Redis knows (the live queue)."""
