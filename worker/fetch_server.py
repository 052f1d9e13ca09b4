"""The fetch tool's MCP server: mcp-server-fetch, connecting only to the address it checked.

mcp-server-fetch refuses private destinations with a request hook that resolves the
host, checks every address, and then lets httpx resolve the name again to connect: a
name whose answer changes in between (DNS rebinding, a TTL of 0) passes the check with a
public address and is connected to 127.0.0.1 or 169.254.169.254. Here each direct
connection resolves the name once, refuses it unless every address is public, and
connects to one of those very addresses. The URL is not rewritten, so the ``Host``
header and the TLS server name (SNI, and the certificate's check) stay the name's.

Everything else is mcp-server-fetch's own (``python -m worker.fetch_server`` takes its
arguments): only its ``make_client`` is replaced. A request sent to a proxy
(``--proxy-url``, the proxy variables) is resolved by the proxy, which is not pinned;
with ``--allow-private-ips`` nothing is checked, so nothing is replaced.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Iterable

import anyio
import httpcore
import httpx
import mcp_server_fetch
from mcp.shared.exceptions import McpError
from mcp.types import INVALID_PARAMS, ErrorData
from mcp_server_fetch import server as upstream

#: mcp-server-fetch's own rule: every special-purpose range refused, on every Python
is_public_address: Callable[[str], bool] = upstream._is_public_address
_upstream_make_client = upstream.make_client


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """Connects to an address of the host's one resolution, once ``allowed`` passed them all."""

    def __init__(self, allowed: Callable[[str], bool] = is_public_address) -> None:
        self._allowed = allowed
        self._network = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            with anyio.fail_after(timeout):
                infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"resolving {host} timed out") from exc
        except OSError as exc:  # socket.gaierror: the name does not resolve
            raise httpcore.ConnectError(f"{host} does not resolve: {exc}") from exc
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        for address in addresses:
            if not self._allowed(address):
                raise McpError(ErrorData(
                    code=INVALID_PARAMS,
                    message=f"Refused to connect to {host}: it resolves to {address}, which is not a "
                    "public address. Start the server with --allow-private-ips to allow private, "
                    "loopback and link-local addresses.",
                ))
        failure: httpcore.ConnectError | httpcore.ConnectTimeout = httpcore.ConnectError(
            f"{host} resolves to no address"
        )
        for address in addresses:  # in the resolver's order, as a connector tries them
            try:
                return await self._network.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("the fetch tool does not connect to Unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._network.sleep(seconds)


class PinnedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over :class:`PinnedBackend` (httpx takes no network backend itself)."""

    def __init__(self, allowed: Callable[[str], bool] = is_public_address) -> None:
        super().__init__()
        limits = httpx.Limits()  # httpx's defaults, as the transport it replaces had
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=PinnedBackend(allowed),
        )


def make_client(proxy_url: str | None) -> httpx.AsyncClient:
    """mcp-server-fetch's client (its proxy handling and errors), whose direct connections are pinned."""
    client = _upstream_make_client(proxy_url)
    # Requests mounted on a proxy keep the proxy's transport; every other one goes through
    # the client's default transport, which httpx lets no argument replace without also
    # dropping the proxy variables.
    client._transport = PinnedTransport()
    return client


def main() -> None:
    if "--allow-private-ips" not in sys.argv[1:]:
        # fetch_url and the robots.txt check call the module's make_client on each request.
        upstream.make_client = make_client
    mcp_server_fetch.main()


if __name__ == "__main__":
    main()
