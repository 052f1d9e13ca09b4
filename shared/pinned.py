"""Outbound HTTP that connects only to the addresses it checked: the fetch tool's rule, one home.

A check that resolves a host name, looks at its addresses and then lets httpx resolve the
name again to connect can be passed by a name whose answer changes in between (DNS
rebinding, a TTL of 0): checked with a public address, connected to 127.0.0.1 or
169.254.169.254. :class:`PinnedTransport` resolves each direct connection's name once,
refuses it unless every address is allowed, and connects to one of those very addresses.
The URL is not rewritten, so the ``Host`` header and the TLS server name (SNI, and the
certificate's check) stay the name's.

Used by the fetch tool's MCP server (worker/tools/fetch_server.py) and by webhooks
(shared/contracts/webhooks.py, worker/schedule/webhooks.py). The rule of what is public is mcp-server-fetch's
own (:func:`is_public_address`).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable

import anyio
import httpcore
import httpx

from shared.compat import fetch_is_public_address


def is_public_address(address: str) -> bool:
    """True for a globally routable unicast address: loopback, private (RFC 1918, unique local),
    link-local (cloud metadata), shared, multicast, documentation and other special-purpose
    ranges are not. mcp-server-fetch's own rule, on every Python.

    Imported on first use: the module costs about half a second, which the API pays only
    when it first checks a webhook (from a thread, :func:`resolve_checked`).
    """
    return fetch_is_public_address(address)


class AddressRefused(httpcore.ConnectError):
    """A host resolved to an address the policy does not allow (nothing was connected to)."""

    def __init__(self, host: str, address: str) -> None:
        super().__init__(f"{host} resolves to {address}, which is not a public address")
        self.host = host
        self.address = address


#: what a refused address raises: :class:`AddressRefused` unless the user says otherwise
Refusal = Callable[[str, str], Exception]


async def resolve_checked(
    host: str, port: int, allowed: Callable[[str], bool], timeout: float | None = None,  # noqa: ASYNC109
    refuse: Refusal = AddressRefused,
) -> list[str]:
    """The addresses of ``host``, resolved once, in the resolver's order, if ``allowed`` passes
    every one; ``refuse(host, address)`` is raised for the first that does not."""
    try:
        with anyio.fail_after(timeout):
            infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except TimeoutError as exc:
        raise httpcore.ConnectTimeout(f"resolving {host} timed out") from exc
    except OSError as exc:  # socket.gaierror: the name does not resolve
        raise httpcore.ConnectError(f"{host} does not resolve: {exc}") from exc
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    for address in addresses:
        if not await anyio.to_thread.run_sync(allowed, address):
            raise refuse(host, address)
    return addresses


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """Connects to an address of the host's one resolution, once ``allowed`` passed them all."""

    def __init__(
        self, allowed: Callable[[str], bool] = is_public_address, refuse: Refusal = AddressRefused
    ) -> None:
        self._allowed = allowed
        self._refuse = refuse
        self._network = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await resolve_checked(host, port, self._allowed, timeout, self._refuse)
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
        raise httpcore.ConnectError("pinned connections are TCP only, never Unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._network.sleep(seconds)


class PinnedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over :class:`PinnedBackend` (httpx takes no network backend itself)."""

    def __init__(
        self, allowed: Callable[[str], bool] = is_public_address, refuse: Refusal = AddressRefused
    ) -> None:
        super().__init__()
        limits = httpx.Limits()  # httpx's defaults, as the transport it replaces had
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=PinnedBackend(allowed, refuse),
        )
