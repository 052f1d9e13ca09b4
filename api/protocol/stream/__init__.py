"""A run's events as the Agent Server's stream modes, the relay that sends them, a thread's
stream, and the SDK's thread streaming session (``threads.stream``)."""
