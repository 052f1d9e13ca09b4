"""What a URL may show of itself: in logs, messages and answers, never its password."""

from __future__ import annotations

import re

_PASSWORD_PARAM = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` as it may be shown (logs, messages, answers): its password replaced by ``***``.

    The password of the userinfo (``scheme://user:PASSWORD@host``) and a ``password``
    query parameter (redis-py reads one) are hidden. A malformed URL is handled too: the
    userinfo runs to the last ``@``, so a password with an unencoded ``/``, ``?`` or ``#``
    is hidden whole (at worst a path holding an ``@`` shows less than it could).
    """
    scheme, sep, rest = url.partition("://")
    if not sep:  # no scheme (a mistake): the password is hidden all the same
        scheme, rest = "", url
    userinfo, at, tail = rest.rpartition("@")
    if at and ":" in userinfo:
        rest = f"{userinfo.partition(':')[0]}:***@{tail}"
    return _PASSWORD_PARAM.sub(r"\1***", f"{scheme}{sep}{rest}")

