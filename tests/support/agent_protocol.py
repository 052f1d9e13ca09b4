"""The Agent Protocol's tests through the Python SDK (``langgraph-sdk``): a run's input, a busy
thread, and the ``client`` fixture (imported by tests/conftest.py) on the module's ``stack`` (a
:class:`~tests.support.env.SophosEnv` the module's own fixture starts)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient

from tests.fakes.ollama import FakeOllama, Hang
from tests.support.env import SophosEnv


def said(text: str, role: str = "user") -> dict[str, Any]:
    """A run's input: one new message."""
    return {"messages": [{"role": role, "content": text}]}


async def busy_thread(client: LangGraphClient, hang: Hang) -> tuple[str, str]:
    """A thread whose first run is answering (held by ``hang``): its id and the run's."""
    thread_id = (await client.threads.create())["thread_id"]
    first = await client.runs.create(thread_id, "agent", input=said("one"))
    await hang.wait_started_async(20)
    return thread_id, first["run_id"]


@pytest.fixture
async def client(stack: SophosEnv, model: FakeOllama) -> AsyncIterator[LangGraphClient]:
    """The SDK's client on the module's shared API and worker (the test's ``model`` reset)."""
    async with get_client(url=stack.api_url) as sdk:
        yield sdk
