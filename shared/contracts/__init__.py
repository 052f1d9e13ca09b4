"""What crosses between the API and the worker: jobs, events, and the Agent Protocol's shared words."""
