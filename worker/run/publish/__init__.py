"""What leaves the worker while a run goes: its events to Redis, a stream of them, its progress."""
