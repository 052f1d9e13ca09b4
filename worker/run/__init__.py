"""A run's life in the worker: the service, turns, ending, stopping, recovery, leases, progress, events."""
