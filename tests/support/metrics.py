"""``/metrics`` read as Prometheus reads it: every sample parsed by prometheus-client's own
parser, by name and labels (:func:`scrape`), or one unlabelled gauge (:func:`gauge`)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.http import http_client

#: a sample: its name and its labels, sorted (``()`` for an unlabelled one)
Key = tuple[str, tuple[tuple[str, str], ...]]
Scrape = dict[Key, float]


def fetch(api_url: str, token: str | None = None) -> httpx.Response:
    """``GET /metrics`` (with the bearer ``token``), which must answer 200."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with http_client(base_url=api_url, timeout=10) as http:
        response = http.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    return response


def parse(text: str) -> Scrape:
    """Every sample of a scrape's ``text``."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(api_url: str, token: str | None = None) -> Scrape:
    """Every sample of ``/metrics`` now."""
    return parse(fetch(api_url, token).text)


def gauge(api_url: str, name: str) -> float | None:
    """The unlabelled sample ``name`` of ``/metrics`` now; None where the scrape has none."""
    return scrape(api_url).get((name, ()))
