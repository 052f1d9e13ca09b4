"""Code both processes share: settings, logging, errors, tracing.

Packages by concern: ``contracts`` (what crosses Redis between the API and the worker),
``redis`` (connections, scripts, the queue, liveness, metrics), ``storage`` (one interface to
either engine). Imports neither ``api`` nor ``worker``.
"""
