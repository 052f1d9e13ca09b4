"""Code both processes share: settings, logging, contracts, errors, schema.

Imports neither ``api`` nor ``worker``.
"""
