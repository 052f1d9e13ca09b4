"""One TLS context a process, for every HTTP client it makes.

httpx builds a context for each client (``ssl.create_default_context()``, which loads the whole CA
bundle: 50 to 130 ms of CPU and its memory, for an ``http://`` URL too). The worker made four at
start (ChatOllama's clients and the model check), each of them the same default context. A context
is safe to share between clients and threads; the certificates it trusts are the same.
"""

from __future__ import annotations

import functools
import ssl


@functools.cache
def default_context() -> ssl.SSLContext:
    """The process's default TLS context (certificates verified against the default CA bundle)."""
    return ssl.create_default_context()
