"""The fetch tool's MCP server: mcp-server-fetch, connecting only to the address it checked.

mcp-server-fetch refuses private destinations with a request hook that resolves the
host, checks every address, and then lets httpx resolve the name again to connect: a
name whose answer changes in between (DNS rebinding, a TTL of 0) passes the check with a
public address and is connected to 127.0.0.1 or 169.254.169.254. Here each direct
connection resolves the name once, refuses it unless every address is public, and
connects to one of those very addresses (shared/pinned.py, which webhooks use too). The
URL is not rewritten, so the ``Host`` header and the TLS server name (SNI, and the
certificate's check) stay the name's.

Everything else is mcp-server-fetch's own (``python -m worker.tools.fetch_server`` takes its
arguments): only its ``make_client`` is replaced. A request sent to a proxy
(``--proxy-url``, the proxy variables) is resolved by the proxy, which is not pinned;
with ``--allow-private-ips`` nothing is checked, so nothing is replaced.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import httpx
import mcp_server_fetch
from mcp.shared.exceptions import McpError
from mcp.types import INVALID_PARAMS, ErrorData
from mcp_server_fetch import server as upstream

from shared import pinned
from shared.compat import replace_default_transport

#: mcp-server-fetch's own rule: every special-purpose range refused, on every Python
is_public_address = pinned.is_public_address
_upstream_make_client = upstream.make_client


def refused(host: str, address: str) -> McpError:
    """What the tool answers for a destination that is not public."""
    return McpError(ErrorData(
        code=INVALID_PARAMS,
        message=f"Refused to connect to {host}: it resolves to {address}, which is not a "
        "public address. Start the server with --allow-private-ips to allow private, "
        "loopback and link-local addresses.",
    ))


class PinnedTransport(pinned.PinnedTransport):
    """The shared pinned transport (shared/pinned.py), refusing as the fetch tool does."""

    def __init__(self, allowed: Callable[[str], bool] = is_public_address) -> None:
        super().__init__(allowed, refused)


def make_client(proxy_url: str | None) -> httpx.AsyncClient:
    """mcp-server-fetch's client (its proxy handling and errors), whose direct connections are pinned."""
    client = _upstream_make_client(proxy_url)
    # Requests mounted on a proxy keep the proxy's transport; every other one goes through
    # the client's default transport, which httpx lets no argument replace without also
    # dropping the proxy variables.
    replace_default_transport(client, PinnedTransport())
    return client


def main() -> None:
    if "--allow-private-ips" not in sys.argv[1:]:
        # fetch_url and the robots.txt check call the module's make_client on each request.
        upstream.make_client = make_client
    mcp_server_fetch.main()


if __name__ == "__main__":
    main()
