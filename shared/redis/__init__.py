"""Redis: connections that outlive a restart, the protocol's scripts, the queue, liveness, metrics."""
