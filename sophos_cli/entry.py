"""The ``sophos`` console script, installed with the package.

``sophos chat|conversations|show|export|rename|delete|runs|cancel|approve ...`` is the
command-line client (:mod:`sophos_cli.commands`), so the commands the tools print
(``sophos approve ID``, ``sophos chat --resume --conversation ID``) can be typed as
printed. ``sophos worker [--check|--copy-to URL]`` and ``sophos api`` start the
service's two processes, as ``python -m worker`` and ``python -m api`` do, and ``sophos
users`` makes and revokes users' keys in the database (:mod:`sophos_cli.users`); they are
imported only when asked for, so the client stays an HTTP client.

``up``, ``test`` and ``audit`` belong to the checkout's ``./sophos`` launcher (it
makes the virtual environment and starts Redis beside the processes).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

CHECKOUT_ONLY = ("up", "test", "audit")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    first = args[0] if args else ""
    if first in ("worker", "api"):
        # Both entry points read sys.argv themselves (`python -m worker --check`).
        sys.argv = [f"sophos {first}", *args[1:]]
        if first == "worker":
            from worker.__main__ import main as process_main
        else:
            from api.__main__ import main as process_main
        result = process_main()
        return result if isinstance(result, int) else 0
    if first == "users":
        # Writes the database itself: imported only when asked for, like the processes.
        from sophos_cli.users import main as users_main

        return users_main(args[1:])
    if first in CHECKOUT_ONLY:
        print(f"sophos: `{first}` is the checkout's launcher: run `./sophos {first}` in the Sophos "
              "folder (here: `sophos worker`, `sophos api`, and the client's commands)", file=sys.stderr)
        return 2
    from sophos_cli.commands import main as client_main

    return client_main(args)
