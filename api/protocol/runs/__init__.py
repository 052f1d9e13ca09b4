"""Runs in the SDK's shape: the service, the creation body, commands, interrupts, forks,
runs without a thread."""
