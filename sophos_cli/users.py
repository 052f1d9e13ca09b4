"""``sophos users add NAME [--operator] | list | revoke NAME``: the users and their keys.

Writes the database itself (the settings' DATABASE_PATH or DATABASE_URL), so no service needs
to run, and a first user can be made before the API starts. ``add`` prints the new key once,
as the last line of its output; the database keeps only its digest. A revoked key is refused
by every API process within a second (api/auth/keys.py).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from shared.errors import SophosError
from shared.settings import Settings
from shared.settings_parsing import SettingsError
from shared.storage.engines import open_migrated_database
from shared.users import add_user, list_users, revoke_user


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(
        prog="sophos users", description="Users and their keys, written to the database directly."
    )
    commands = main.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add = commands.add_parser("add", help="make a user and print its key (once)")
    add.add_argument("name")
    add.add_argument("--operator", action="store_true", help="sees and acts on everything")
    commands.add_parser("list", help="every user, operator or not, revoked or not")
    revoke = commands.add_parser("revoke", help="refuse the user's key from now on")
    revoke.add_argument("name")
    return main


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    db = await open_migrated_database(settings)
    try:
        if args.command == "add":
            key = await add_user(db, args.name, operator=args.operator)
            kind = "operator" if args.operator else "user"
            print(f"{kind} {args.name} made; its key, shown only now "
                  "(send it as Authorization: Bearer KEY, or x-api-key):")
            print(key)
        elif args.command == "list":
            for user in await list_users(db):
                state = f"revoked {user.revoked_at}" if user.revoked_at else "active"
                role = "operator" if user.operator else "user"
                print(f"{user.name}\t{role}\t{state}\tsince {user.created_at}")
        else:
            await revoke_user(db, args.name)
            print(f"{args.name}: key revoked")
    finally:
        await db.close()
    return 0


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        print(f"sophos users: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_run(args, settings))
    except SophosError as exc:
        print(f"sophos users: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
