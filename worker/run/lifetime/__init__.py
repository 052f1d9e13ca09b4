"""Runs beyond one step: stopping them, recovering those a dead worker left, the leases that fence them."""
