"""Assistants: stored configurations of the one agent (its graph and schemas, the service, the controller)."""
