"""The single worker: owns the SQLite file, runs the agent graph for arq jobs."""
