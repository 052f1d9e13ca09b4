"""Who is asking: the caller of the request being served, known to every layer below the guard.

The guard (api/auth/guard.py) decides the caller once per request and binds it here; the
layers that read and write a user's data (api/auth/scope.py and what it feeds: the store, the
live queue, the Agent Protocol's threads) ask :func:`caller` instead of being handed it, so a
new route cannot forget to pass it on. Outside a request there is no caller, and asking for
one is an error: nothing reads a user's data on nobody's behalf by accident.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Literal

from shared.users import LOCAL_USER, TOKEN_USER

How = Literal["local", "token", "key", "oidc"]


@dataclass(frozen=True, slots=True)
class Caller:
    """A user (``operator``: sees and acts on everything) and how they proved it."""

    name: str
    operator: bool
    how: How

    def owns(self, owner: str) -> bool:
        """May this caller see and act on what ``owner`` owns?"""
        return self.operator or owner == self.name


#: the one user of an API without identities, on loopback: everything is theirs
LOCAL = Caller(LOCAL_USER, operator=True, how="local")
#: whoever presents API_TOKEN: the shared operator token of before identities
TOKEN = Caller(TOKEN_USER, operator=True, how="token")

_caller: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("sophos_caller", default=None)


def caller() -> Caller:
    """The caller of the request being served. RuntimeError outside one (a bug, not a 4xx)."""
    current = _caller.get()
    if current is None:
        raise RuntimeError("no caller: a user's data was asked for outside a request")
    return current


def current_or_none() -> Caller | None:
    return _caller.get()


def bind(who: Caller) -> contextvars.Token[Caller | None]:
    return _caller.set(who)


def unbind(token: contextvars.Token[Caller | None]) -> None:
    _caller.reset(token)
