"""How the worker takes jobs from arq's queue: asleep on Redis until a job is submitted, then in
one round trip (wakeup.py), in a fair order across owners (fair.py), through arq's own loop with
the hooks those need (compat.py: every reach into arq's private names, and its test).
"""
