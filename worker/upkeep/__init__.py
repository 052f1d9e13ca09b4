"""Upkeep: the sweep, retention, deletion, renaming, and copying a deployment to PostgreSQL."""
