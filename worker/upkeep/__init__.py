"""Upkeep: the sweep, retention, deletion, renaming, writing assistants, and copying a deployment
to PostgreSQL."""
