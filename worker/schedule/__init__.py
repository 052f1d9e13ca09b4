"""What runs by the clock: crons, webhooks after a run, approval deadlines."""
