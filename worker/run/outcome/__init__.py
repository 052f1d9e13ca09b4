"""How a run ends: the one ending, the outcomes it records, the outcome of each failure."""
