"""The API's HTTP client (api/resources.py ``LazyClient``): made on first use, once, and closed."""

from __future__ import annotations

from api.resources import LazyClient


async def test_the_http_client_is_made_on_first_use_and_closed_with_the_resources() -> None:
    http = LazyClient()
    assert not http.made  # an API that nothing probes holds no client (bench figure 16)
    client = http.get()
    assert http.get() is client and http.made
    await http.aclose()
    assert client.is_closed and not http.made
