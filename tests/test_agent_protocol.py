"""The Agent Protocol (docs/agent-protocol.md) driven by the real ``langgraph-sdk`` client against a
real API and worker, with the fake model: every claim of that page is one of these tests (the pure
parts, translation and statuses, are in tests/fast/test_agent_protocol_translate.py)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import signal
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any, cast

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import APIStatusError, ConflictError, NotFoundError, UnprocessableEntityError
from langgraph_sdk.schema import Command

from api.protocol.runs.service import ASSISTANT_ID
from tests.fakes.ollama import FakeOllama, Hang, Text, ToolCalls
from tests.support.agent_protocol import said
from tests.support.client import chat, get_json, tool_calls, wait_for_async
from tests.support.env import SophosEnv, mcp_servers, not_safe_to_repeat
from tests.support.http import async_http_client
from tests.support.js_sdk import run_js
from tests.support.stacks import approval_stack

#: the one decision that approves the one pending call
APPROVE: Command = {"resume": {"decisions": [{"type": "approve"}]}}

#: the tests on the module's shared stack run in one xdist worker, which starts it once
shared_stack = pytest.mark.xdist_group("test_agent_protocol")


def messages_of(thread: Any) -> list[dict[str, Any]]:
    values = thread["values"]
    assert isinstance(values, dict)
    return list(values["messages"])


def text_of(message: dict[str, Any]) -> str:
    content = message["content"]
    return content if isinstance(content, str) else "".join(b.get("text", "") for b in content)




@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, fake_ollama: FakeOllama) -> Iterator[SophosEnv]:
    """One API and worker for the tests that share them, on a Redis of their own (the other tests
    flush theirs). The fake tools server's ``add`` asks for approval."""
    with approval_stack(tmp_path_factory.mktemp("protocol"), fake_ollama) as env:
        yield env


async def wait(client: LangGraphClient, thread_id: str, text: str, **options: Any) -> dict[str, Any]:
    """``runs.wait`` with one user message: the thread's values at the run's end."""
    values = await client.runs.wait(thread_id, "agent", input=said(text), **options)
    assert isinstance(values, dict)
    return values


async def run_status(
    client: LangGraphClient, thread_id: str, run_id: str, *statuses: str
) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        run = dict(await client.runs.get(thread_id, run_id))
        return run if run["status"] in statuses else None

    return await wait_for_async(reached, timeout=30, message=f"run {run_id} {' or '.join(statuses)}")


@shared_stack
async def test_assistants_and_threads(client: LangGraphClient, model: FakeOllama) -> None:
    assistants = await client.assistants.search()
    assert [(a["assistant_id"], a["graph_id"]) for a in assistants] == [(ASSISTANT_ID, "agent")]
    assert (await client.assistants.get("agent"))["assistant_id"] == ASSISTANT_ID
    assert (await client.assistants.get(ASSISTANT_ID))["graph_id"] == "agent"
    assert await client.assistants.search(graph_id="other") == []
    with pytest.raises(NotFoundError):
        await client.assistants.get("other")
    drawn = await client.assistants.get_graph("agent", xray=True)
    assert {n["id"] for n in drawn["nodes"]} == {"__start__", "agent", "approval", "tools", "__end__"}
    edges = {(e["source"], e["target"]) for e in drawn["edges"]}
    assert {("__start__", "agent"), ("agent", "tools"), ("agent", "approval"), ("tools", "agent")} <= edges
    schemas = await client.assistants.get_schemas(ASSISTANT_ID)
    assert schemas["graph_id"] == "agent" and schemas["config_schema"] is None
    input_schema = schemas["input_schema"]
    assert input_schema is not None and input_schema["properties"]["messages"]["maxItems"] == 1  # one message
    assert await client.assistants.get_subgraphs("agent") == {}
    with pytest.raises(NotFoundError):
        await client.assistants.get_graph("other")
    info = await client.http.get("/info")
    assert info["flags"]["crons"] is True and info["flags"]["langsmith"] is False

    # A thread created empty: idle, no values, its metadata kept.
    thread = await client.threads.create(metadata={"user": "ada"})
    thread_id = thread["thread_id"]
    assert thread["status"] == "idle" and thread["metadata"] == {"user": "ada", "owner": "local"}
    got = await client.threads.get(thread_id)
    assert got["status"] == "idle" and got["values"] == {}
    assert got["metadata"] == {"user": "ada", "owner": "local"}
    state = await client.threads.get_state(thread_id)
    assert state["values"] == {} and state["next"] == [] and state["tasks"] == []

    # if_exists: raise (the default) is 409; do_nothing answers the thread as it is.
    with pytest.raises(ConflictError):
        await client.threads.create(thread_id=thread_id)
    same = await client.threads.create(thread_id=thread_id, if_exists="do_nothing", metadata={"user": "bob"})
    assert same["metadata"] == {"user": "ada", "owner": "local"}
    chosen = str(uuid.uuid4())
    assert (await client.threads.create(thread_id=chosen))["thread_id"] == chosen

    # Its first run creates its conversation under the same id.
    model.script(Text("Hello Ada."))
    values = await wait(client, thread_id, "hi")
    assert [text_of(m) for m in values["messages"]] == ["hi", "Hello Ada."]
    conversation = get_json(str(client.http.client.base_url), f"/api/conversations/{thread_id}")
    assert conversation is not None
    assert [m["content"] for m in conversation["messages"]] == ["hi", "Hello Ada."]
    got = await client.threads.get(thread_id)
    # Once it has had a run, the server says its graph and assistant, as the Agent Server does.
    ran = {"graph_id": "agent", "assistant_id": ASSISTANT_ID}
    assert got["status"] == "idle" and got["metadata"] == {"user": "ada", **ran, "owner": "local"}
    assert thread_id in [t["thread_id"] for t in await client.threads.search(metadata={"graph_id": "agent"})]
    assert [m["type"] for m in messages_of(got)] == ["human", "ai"]

    # Search: both kinds of thread, newest first, by metadata, by status, by ids (the stack is
    # shared: other tests' threads are there too).
    both = [thread_id, chosen]
    found = [t["thread_id"] for t in await client.threads.search(ids=both)]
    assert found == [chosen, thread_id]
    assert [t["thread_id"] for t in await client.threads.search(limit=2)] == found  # the newest
    assert [t["thread_id"] for t in await client.threads.search(metadata={"user": "ada"})] == [thread_id]
    assert [t["thread_id"] for t in await client.threads.search(ids=[chosen])] == [chosen]
    assert await client.threads.search(status="busy", ids=both) == []
    assert [t["thread_id"] for t in await client.threads.search(ids=both, limit=1, offset=1)] == [thread_id]

    # Delete: the conversation with it, and the empty one.
    await client.threads.delete(thread_id)
    await client.threads.delete(chosen)
    for gone in (thread_id, chosen):
        with pytest.raises(NotFoundError):
            await client.threads.get(gone)
    assert await client.threads.search(ids=both) == []
    assert await client.threads.search(metadata={"user": "ada"}) == []


@shared_stack
async def test_runs_create_join_stream_and_rejoin(client: LangGraphClient, model: FakeOllama) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    model.script(Text("First answer."))
    run = await client.runs.create(thread_id, "agent", input=said("one", "human"))
    assert run["status"] in ("pending", "running") and run["thread_id"] == thread_id
    values = await client.runs.join(thread_id, run["run_id"])
    assert text_of(values["messages"][-1]) == "First answer."
    assert (await client.runs.get(thread_id, run["run_id"]))["status"] == "success"

    # Stream a second run: metadata first, tokens as messages-tuple, the final values, end.
    model.script(Text("Second answer, streamed."))
    created: list[Any] = []
    parts = [
        p async for p in client.runs.stream(
            thread_id, "agent", input=said("two"),
            stream_mode=["messages-tuple", "values"], metadata={"case": "stream"},
            on_run_created=created.append, stream_subgraphs=True,  # no subgraphs: the same stream
        )
    ]
    events = [p.event for p in parts]
    assert events[0] == "metadata" and events[-1] == "end" and events[-2] == "values"
    run_id = parts[0].data["run_id"]
    assert created == [{"run_id": run_id, "thread_id": thread_id}]  # read from Content-Location
    tokens = [p.data for p in parts if p.event == "messages"]
    assert "".join(chunk["content"] for chunk, _ in tokens) == "Second answer, streamed."
    assert {meta["langgraph_node"] for _, meta in tokens} == {"agent"}
    final = parts[-2].data["messages"]
    assert [text_of(m) for m in final] == ["one", "First answer.", "two", "Second answer, streamed."]
    # The first run replayed after the second: it ends with the values it left (its own last
    # checkpoint), not the thread's now; so does a rejoin from one of its parts.
    first = [p async for p in client.runs.join_stream(thread_id, run["run_id"], last_event_id="-1")]
    assert [p.event for p in first[-2:]] == ["values", "end"]
    assert [text_of(m) for m in first[-2].data["messages"]] == ["one", "First answer."]
    rejoined = [p async for p in client.runs.join_stream(thread_id, run["run_id"], last_event_id=first[1].id)]
    assert rejoined[-2].data == first[-2].data
    assert parts[-1].data == {"run_id": run_id, "status": "success"}
    ids = [p.id for p in parts[1:]]
    assert None not in ids and len(set(ids)) == len(ids)  # every event after metadata has its own id

    # Rejoin after the fact: -1 replays the whole run, beginning with metadata; an id resumes
    # right after it.
    replay = [p async for p in client.runs.join_stream(thread_id, run_id, last_event_id="-1")]
    assert [(p.event, p.id) for p in replay] == [(p.event, p.id) for p in parts]
    middle = parts[len(parts) // 2]
    rest = [p async for p in client.runs.join_stream(thread_id, run_id, last_event_id=middle.id)]
    assert [p.id for p in rest] == [p.id for p in parts[parts.index(middle) + 1 :]]
    updates = [
        p.data
        async for p in client.runs.join_stream(thread_id, run_id, last_event_id="-1", stream_mode="updates")
        if p.event == "updates"
    ]
    assert text_of(updates[-1]["agent"]["messages"][0]) == "Second answer, streamed."

    runs: list[dict[str, Any]] = [dict(r) for r in await client.runs.list(thread_id)]
    assert [r["run_id"] for r in runs] == [run_id, run["run_id"]]
    assert runs[0]["metadata"] == {"case": "stream"}
    assert runs[0]["kwargs"]["stream_mode"] == ["messages-tuple", "values"]
    assert [r["run_id"] for r in await client.runs.list(thread_id, status="success", limit=1)] == [run_id]


@shared_stack
async def test_tool_calls_stream_as_updates(client: LangGraphClient, model: FakeOllama) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    model.script(ToolCalls([("tools__echo", {"text": "ping"})]), Text("Echoed."))
    parts = [
        p async for p in client.runs.stream(
            thread_id, "agent", input=said("echo ping"),
            stream_mode="updates",
        )
    ]
    updates = [p.data for p in parts if p.event == "updates"]
    assert [next(iter(u)) for u in updates] == ["agent", "tools", "agent"]
    call = updates[0]["agent"]["messages"][0]["tool_calls"][0]
    assert call["name"] == "tools__echo" and call["args"] == {"text": "ping"}
    result = updates[1]["tools"]["messages"][0]
    assert result["type"] == "tool" and result["tool_call_id"] == call["id"] and "ping" in text_of(result)
    assert text_of(updates[2]["agent"]["messages"][0]) == "Echoed."


@shared_stack
async def _streamed(client: LangGraphClient, thread_id: str, run_id: str, text: str) -> None:
    """Return once the run's streamed message chunks add up to ``text``."""
    got = ""
    parts = client.runs.join_stream(thread_id, run_id, stream_mode="messages-tuple", last_event_id="-1")
    async for part in parts:
        if part.event.startswith("messages") and isinstance(part.data, list) and part.data:
            got += str(part.data[0].get("content") or "")
            if got == text:
                return


async def test_cancel_a_running_run(client: LangGraphClient, model: FakeOllama) -> None:
    hang = Hang(text="Thinking about it")
    model.script(hang)
    thread_id = (await client.threads.create())["thread_id"]
    run = await client.runs.create(thread_id, "agent", input=said("slowly"))
    await hang.wait_started_async(20)
    # The model has sent its text; the cut keeps what the worker has streamed: wait for all of it.
    await asyncio.wait_for(_streamed(client, thread_id, run["run_id"], "Thinking about it"), 30)
    assert (await client.threads.get(thread_id))["status"] == "busy"
    # One run per thread: a second is refused while the first holds it (multitask_strategy reject;
    # the default, enqueue, is tests/test_agent_protocol_enqueue.py's).
    with pytest.raises(ConflictError):
        await client.runs.create(thread_id, "agent", input=said("two"), multitask_strategy="reject")

    # With wait, the answer is the thread's values once the run has ended, as the Agent Server's.
    values: Any = await client.runs.cancel(thread_id, run["run_id"], wait=True)  # type: ignore[func-returns-value]
    assert [text_of(m) for m in values["messages"]] == ["slowly", "Thinking about it"]
    assert (await client.runs.get(thread_id, run["run_id"]))["status"] == "interrupted"
    thread = await client.threads.get(thread_id)
    assert thread["status"] == "idle"
    assert [text_of(m) for m in messages_of(thread)] == ["slowly", "Thinking about it"]
    end = [p async for p in client.runs.join_stream(thread_id, run["run_id"], last_event_id="-1")][-1]
    assert end.event == "end" and end.data["status"] == "interrupted"


async def test_crash_mid_run_then_a_run_without_input_resumes(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    hang = Hang(text="half an ")
    model.script(hang, Text("answer, after the crash."))
    (sophos_env.root / "empty").mkdir(exist_ok=True)
    config = mcp_servers(sophos_env.tools_log, sophos_env.root / "empty")
    sophos_env.write_mcp_config(not_safe_to_repeat(config))
    worker = start_worker(sophos_env)
    api = start_api(sophos_env)
    async with get_client(url=api.url) as client:
        thread_id = (await client.threads.create())["thread_id"]
        run = await client.runs.create(thread_id, "agent", input=said("go"))
        await hang.wait_started_async(20)
        worker.kill()
        assert worker.wait(10) == -signal.SIGKILL

        restarted = start_worker(sophos_env)
        crashed = await run_status(client, thread_id, run["run_id"], "interrupted", "error", "success")
        assert crashed["status"] == "interrupted"
        thread = await client.threads.get(thread_id)
        assert thread["status"] == "interrupted"  # resumable: its last checkpoint has a task to run
        assert (await client.threads.get_state(thread_id))["next"] == ["agent"]
        end = [p async for p in client.runs.join_stream(thread_id, run["run_id"], last_event_id="-1")][-2:]
        assert [p.event for p in end] == ["error", "end"] and end[0].data["error"] == "INTERRUPTED"

        resumed = await client.runs.create(thread_id, "agent")  # no input: resume
        values = await client.runs.join(thread_id, resumed["run_id"])
        assert [text_of(m) for m in values["messages"]] == ["go", "answer, after the crash."]
        assert (await client.runs.get(thread_id, resumed["run_id"]))["status"] == "success"
        assert (await client.threads.get(thread_id))["status"] == "idle"
        with pytest.raises(ConflictError):  # nothing left to resume
            await client.runs.create(thread_id, "agent")

        # Killed while a call was out, of a tool not safe to repeat: the resume asks before it
        # sends the call again, as an interrupt describing it as a call that may already have run.
        model.script(ToolCalls([("tools__slow", {"seconds": 1.5})]), Text("All done."))
        slow = await client.runs.create(thread_id, "agent", input=said("do the slow thing"))
        await wait_for_async(
            lambda: tool_calls(sophos_env.tools_log, "slow"), timeout=20, message="the slow call sent"
        )
        restarted.kill()
        assert restarted.wait(10) == -signal.SIGKILL
        start_worker(sophos_env)
        crashed = await run_status(client, thread_id, slow["run_id"], "interrupted", "error", "success")
        assert crashed["status"] == "interrupted"
        assert (await client.threads.get(thread_id))["status"] == "interrupted"
        asked = await client.runs.wait(thread_id, "agent")  # no input: resume
        assert isinstance(asked, dict)
        [request] = _interrupt_of(asked)["value"]["action_requests"]
        assert request["name"] == "tools__slow" and request["args"] == {"seconds": 1.5}
        assert request["description"].startswith("This call may already have run")
        assert len(tool_calls(sophos_env.tools_log, "slow")) == 1
        done = await client.runs.wait(thread_id, "agent", command=APPROVE)
        assert isinstance(done, dict) and text_of(done["messages"][-1]) == "All done."
        sent = tool_calls(sophos_env.tools_log, "slow")
        assert len(sent) == 2 and sent[0]["key"] == sent[1]["key"]  # sent once more, with its key
    assert model.calls == 4


@shared_stack
async def test_refusals_are_enveloped_and_change_nothing(client: LangGraphClient, model: FakeOllama) -> None:
    base = str(client.http.client.base_url)
    thread_id = (await client.threads.create(metadata={"keep": True}))["thread_id"]
    missing = str(uuid.uuid4())
    bad_input: list[dict[str, Any]] = [
        {"messages": [{"role": "assistant", "content": "not yours"}]},
        {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
        {"messages": "hello"},
        {"other": 1},
        {"messages": [{"role": "user", "content": "   "}]},
    ]
    for graph_input in bad_input:
        with pytest.raises(UnprocessableEntityError):
            await client.runs.create(thread_id, "agent", input=graph_input)
    unknown_strategy: Any = "later"
    with pytest.raises(UnprocessableEntityError, match="multitask_strategy"):
        await client.runs.create(thread_id, "agent", input=said("hi"), multitask_strategy=unknown_strategy)
    with pytest.raises(UnprocessableEntityError, match="stream_mode"):
        await client.runs.create(thread_id, "agent", input=said("hi"), stream_mode="lifecycle")
    with pytest.raises(NotFoundError):
        await client.runs.create(thread_id, "other", input=said("hi"))
    with pytest.raises(NotFoundError):
        await client.runs.create(missing, "agent", input=said("hi"))
    with pytest.raises(NotFoundError):
        await client.threads.get(missing)
    with pytest.raises(ConflictError):  # an empty thread has nothing to resume
        await client.runs.create(thread_id, "agent")

    async with async_http_client(base_url=base) as http:
        for method, path, body in [
            ("GET", "/threads/not-a-uuid", None),
            ("POST", "/threads", {"thread_id": "nope"}),
            ("POST", f"/threads/{thread_id}/runs", {"assistant_id": "agent", "input": []}),
            ("POST", f"/threads/{thread_id}/runs", b"{not json"),
            ("GET", f"/threads/{thread_id}/runs/{missing}/stream", None),
            ("POST", "/threads/search", {"status": "sleeping"}),
        ]:
            content = body if isinstance(body, bytes) else None
            response = await http.request(method, path, json=None if content else body, content=content)
            assert 400 <= response.status_code < 500, (path, response.status_code)
            error = response.json()
            assert error["error"]["code"] and error["error"]["message"] == error["detail"], (path, error)
        malformed = await http.get("/threads/not-a-uuid")
        assert malformed.status_code == 422 and malformed.json()["error"]["code"] == "BAD_REQUEST"
        assert (await http.get(f"/threads/{thread_id}/runs/{missing}")).status_code == 404
        assert (await http.get(f"/threads/{thread_id}/runs/{missing}/stream")).status_code == 404

    # Nothing was damaged: the thread is as created, and takes a run.
    thread = await client.threads.get(thread_id)
    assert thread["status"] == "idle" and thread["values"] == {}
    assert thread["metadata"] == {"keep": True, "owner": "local"}
    assert await client.runs.list(thread_id) == []
    model.script(Text("Still fine."))
    async with async_http_client(base_url=base) as http:
        # checkpoint_during (deprecated in the SDK) is taken: every step is checkpointed anyway.
        run_body = {"assistant_id": "agent", "input": said("ok?"), "checkpoint_during": False}
        accepted = await http.post(f"/threads/{thread_id}/runs", json=run_body)
    run_id = accepted.json()["run_id"]
    assert accepted.headers["location"] == f"/threads/{thread_id}/runs/{run_id}/stream"
    assert accepted.headers["content-location"] == f"/threads/{thread_id}/runs/{run_id}"
    values = await client.runs.join(thread_id, run_id)
    assert text_of(values["messages"][-1]) == "Still fine."
    # A run created with if_not_exists=create makes its thread.
    model.script(Text("New."))
    made = str(uuid.uuid4())
    values = await wait(client, made, "hi", if_not_exists="create")
    assert text_of(values["messages"][-1]) == "New."


async def test_api_token_as_bearer_or_x_api_key(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    env = sophos_env.with_(API_TOKEN="s3cret-token")
    api = start_api(env)
    async with get_client(url=api.url, api_key=None) as anonymous:
        with pytest.raises(APIStatusError) as refused:
            await anonymous.threads.search()
        assert refused.value.status_code == 401
    async with get_client(url=api.url, api_key="s3cret-token") as keyed:
        assert await keyed.threads.search() == []
    bearer_header = {"Authorization": "Bearer s3cret-token"}
    async with get_client(url=api.url, api_key=None, headers=bearer_header) as bearer:
        assert await bearer.threads.search() == []
    # Every route of the protocol's, from the app's own document, asks for the token; /ok alone does not.
    async with async_http_client(base_url=api.url) as http:
        paths = (await http.get("/schema/openapi.json")).json()["paths"]
        routes = [
            (method.upper(), re.sub(r"\{[^}]+\}", str(uuid.uuid4()), path))
            for path, operations in paths.items()
            for method, operation in operations.items()
            if "agent protocol" in operation.get("tags", [])
        ]
        assert len(routes) >= 17, routes
        for method, url in routes:
            for headers in ({}, {"x-api-key": "wrong"}, {"Authorization": "Bearer wrong"}):
                response = await http.request(method, url, headers=headers)
                if url == "/ok":
                    assert response.status_code == 200 and response.json() == {"ok": True}
                else:
                    assert response.status_code == 401, (method, url, headers)
                    assert response.json()["error"]["code"] == "UNAUTHORIZED"


def _interrupt_of(values: dict[str, Any]) -> dict[str, Any]:
    [interrupt] = values["__interrupt__"]
    return dict(interrupt)


@shared_stack
async def test_an_approval_is_an_interrupt_decided_with_command_resume(
    client: LangGraphClient, stack: SophosEnv, model: FakeOllama
) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), Text("The sum is 5."))
    parts = [
        p async for p in client.runs.stream(
            thread_id, "agent", input=said("add 2 and 3"), stream_mode=["updates", "values"]
        )
    ]
    asked = [p.data["__interrupt__"] for p in parts if p.event == "updates" and "__interrupt__" in p.data]
    assert parts[-1].data["status"] == "success"  # as the Agent Server ends a paused run
    [[interrupt]] = asked
    described = 'Tool execution requires approval\n\nTool: tools__add\nArgs: {"a": 2, "b": 3}'
    assert interrupt["value"] == {
        "action_requests": [{"name": "tools__add", "args": {"a": 2, "b": 3}, "description": described}],
        "review_configs": [{"action_name": "tools__add", "allowed_decisions": ["approve", "edit", "reject"]}],
        # the earlier HumanInterrupt, for the published agent-chat-ui (api/protocol/runs/interrupts.py)
        "action_request": {"action": "tools__add", "args": {"a": 2, "b": 3}}, "description": described,
        "config": {"allow_ignore": False, "allow_respond": True, "allow_edit": True, "allow_accept": True},
    }
    assert _interrupt_of(parts[-2].data) == interrupt  # the last values carry it too
    thread = await client.threads.get(thread_id)
    assert thread["status"] == "interrupted"
    [listed] = await client.threads.search(ids=[thread_id])
    # A search answers each thread with its values and interrupts, as threads.get does.
    assert listed["status"] == "interrupted" and listed["interrupts"] == thread["interrupts"]
    assert listed["values"] == thread["values"]
    [(task_id, [by_task])] = thread["interrupts"].items()
    assert by_task == interrupt
    state = await client.threads.get_state(thread_id)
    assert state["interrupts"] == [interrupt] and state["next"] == ["approval"]
    assert [(t["id"], t["interrupts"]) for t in state["tasks"]] == [(task_id, [interrupt])]
    assert tool_calls(stack.tools_log, "add") == []

    # Refusals change nothing: a count that does not match, a new message over the decision.
    with pytest.raises(UnprocessableEntityError, match="2 decision"):
        await client.runs.create(
            thread_id, "agent", command={"resume": {"decisions": [{"type": "approve"}] * 2}}
        )
    with pytest.raises(ConflictError):
        await client.runs.create(thread_id, "agent", input=said("never mind"))

    # Approve: the call runs once, the answer follows (strict_resume is taken: decisions must
    # match the pending requests anyway).
    values = await client.runs.wait(thread_id, "agent", command=APPROVE, strict_resume=True)
    assert isinstance(values, dict) and "__interrupt__" not in values
    assert text_of(values["messages"][-1]) == "The sum is 5."
    assert [c["args"] for c in tool_calls(stack.tools_log, "add")] == [{"a": 2, "b": 3}]
    assert (await client.threads.get(thread_id))["status"] == "idle"
    with pytest.raises(ConflictError):  # acted on once: nothing waits any more
        await client.runs.create(thread_id, "agent", command=APPROVE)

    # Reject, by the interrupt's id: never sent; the model hears the message.
    model.script(ToolCalls([("tools__add", {"a": 1, "b": 1})]), Text("I will not add them."))
    paused = await client.runs.wait(thread_id, "agent", input=said("add 1 and 1"))
    assert isinstance(paused, dict)
    interrupt = _interrupt_of(paused)
    assert interrupt["value"]["action_requests"][0]["args"] == {"a": 1, "b": 1}
    rejected = await client.runs.wait(
        thread_id, "agent",
        command={"resume": {interrupt["id"]: {"decisions": [{"type": "reject", "message": "not today"}]}}},
    )
    assert isinstance(rejected, dict) and text_of(rejected["messages"][-1]) == "I will not add them."
    told = model.requests[-1]["messages"][-1]
    assert told["role"] == "tool" and "not today" in told["content"]
    assert len(tool_calls(stack.tools_log, "add")) == 1

    # Edit: the call runs with the edited arguments.
    model.script(ToolCalls([("tools__add", {"a": 5, "b": 5})]), Text("Done, edited."))
    await client.runs.wait(thread_id, "agent", input=said("add 5 and 5"))
    edit = {"type": "edit", "edited_action": {"name": "tools__add", "args": {"a": 40, "b": 2}}}
    run = await client.runs.create(thread_id, "agent", command={"resume": {"decisions": [edit]}})
    edited = await client.runs.join(thread_id, run["run_id"])
    assert text_of(edited["messages"][-1]) == "Done, edited."
    assert [c["args"] for c in tool_calls(stack.tools_log, "add")][-1] == {"a": 40, "b": 2}


@shared_stack
async def test_history_newest_first_and_metadata_updates(client: LangGraphClient, model: FakeOllama) -> None:
    thread_id = (await client.threads.create(metadata={"user": "grace"}))["thread_id"]
    assert await client.threads.get_history(thread_id) == []  # empty: no checkpoint yet
    model.script(ToolCalls([("tools__echo", {"text": "hi"})]), Text("Echoed."))
    await wait(client, thread_id, "echo hi")

    history: list[Any] = list(await client.threads.get_history(thread_id, limit=100))
    state = await client.threads.get_state(thread_id)
    assert history[0]["checkpoint"] == state["checkpoint"] and history[0]["values"] == state["values"]
    for newer, older in itertools.pairwise(history):
        assert newer["parent_checkpoint"]["checkpoint_id"] == older["checkpoint"]["checkpoint_id"]
        assert len(newer["values"].get("messages", [])) >= len(older["values"].get("messages", []))
    assert history[-1]["parent_checkpoint"] is None  # the thread's first checkpoint
    assert history[0]["next"] == [] and [t["name"] for t in history[1]["tasks"]] == ["agent"]
    assert [m["type"] for m in history[0]["values"]["messages"]] == ["human", "ai", "tool", "ai"]
    assert text_of(history[0]["values"]["messages"][-1]) == "Echoed."
    # limit and before page through it.
    page = await client.threads.get_history(thread_id, limit=2, before=history[1]["checkpoint"])
    assert [s["checkpoint"] for s in page] == [s["checkpoint"] for s in history[2:4]]
    before = history[1]["checkpoint"]["checkpoint_id"]
    by_get = await client.http.get(f"/threads/{thread_id}/history", params={"limit": 2, "before": before})
    assert by_get == page
    with pytest.raises(UnprocessableEntityError):
        await client.threads.get_history(thread_id, before="not a checkpoint id!")
    # The state at one of its checkpoints, by id or by checkpoint.
    older = history[2]
    at = await client.threads.get_state(thread_id, checkpoint_id=older["checkpoint"]["checkpoint_id"])
    assert at == older
    assert await client.threads.get_state(thread_id, checkpoint=older["checkpoint"]) == older
    with pytest.raises(NotFoundError):
        await client.threads.get_state(thread_id, checkpoint_id=str(uuid.uuid4()))
    with pytest.raises(UnprocessableEntityError, match="select"):
        await client.threads.get_state(thread_id, select=["values.messages"])
    with pytest.raises(UnprocessableEntityError, match="metadata keys"):
        await client.threads.get_history(thread_id, metadata={"a') OR 1=1 --": 1})
    [first] = await client.threads.get_history(thread_id, metadata={"step": -1})
    assert first["checkpoint"] == history[-1]["checkpoint"]  # LangGraph's own metadata filters

    # Update merges metadata; a conversation started on /api/chat takes metadata too.
    updated = await client.threads.update(thread_id, metadata={"topic": "echo", "graph_id": "mine"})
    ran = {"graph_id": "agent", "assistant_id": ASSISTANT_ID}  # the server's: a client's are dropped
    assert updated["metadata"] == {"user": "grace", "topic": "echo", **ran, "owner": "local"}
    stored = (await client.threads.get(thread_id))["metadata"]
    assert stored == {"user": "grace", "topic": "echo", **ran, "owner": "local"}
    found = await client.threads.search(metadata={"topic": "echo"})
    assert [t["thread_id"] for t in found] == [thread_id]
    model.script(Text("Native."))
    native, native_run = chat(str(client.http.client.base_url), "from /api/chat")
    assert text_of((await client.runs.join(native, native_run))["messages"][-1]) == "Native."
    updated_native = await client.threads.update(native, metadata={"via": "api"})
    assert updated_native["metadata"] == {"via": "api", **ran, "owner": "local"}
    assert [t["thread_id"] for t in await client.threads.search(metadata={"via": "api"})] == [native]
    with pytest.raises(NotFoundError):
        await client.threads.update(str(uuid.uuid4()), metadata={"a": 1})
    with pytest.raises(UnprocessableEntityError, match="keep_latest"):
        await client.threads.update(thread_id, metadata={}, ttl={"strategy": "keep_latest", "ttl": 60})


async def _leave_once_answering(parts: AsyncIterator[Any], hang: Hang) -> str:
    """Read the stream until the model answers (the run is mid-step), then leave: the
    connection closes. The run's id, from the stream's metadata."""
    run_id = ""
    async with contextlib.aclosing(cast(AsyncGenerator[Any, None], parts)) as stream:
        async for part in stream:  # the first part: the metadata, or (a rejoin) the first token
            run_id = part.data["run_id"] if part.event == "metadata" else ""
            await hang.wait_started_async(20)
            break
    return run_id


@shared_stack
async def test_a_stream_left_cancels_its_run_only_when_asked(
    client: LangGraphClient, model: FakeOllama
) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    # on_disconnect="cancel": the client leaves mid-run, and the run is cancelled.
    hang = Hang(text="Working")
    model.script(hang)
    run_id = await _leave_once_answering(
        client.runs.stream(thread_id, "agent", input=said("one"), on_disconnect="cancel"), hang
    )
    assert (await run_status(client, thread_id, run_id, "interrupted", "success"))["status"] == "interrupted"

    # By default ("continue") the run goes on without its client.
    hang = Hang(text="Still working")
    model.script(hang)
    run_id = await _leave_once_answering(client.runs.stream(thread_id, "agent", input=said("two")), hang)
    assert (await client.runs.get(thread_id, run_id))["status"] == "running"
    hang.release()
    assert (await run_status(client, thread_id, run_id, "interrupted", "success"))["status"] == "success"

    # A rejoin with cancel_on_disconnect: leaving it cancels the run.
    hang = Hang(text="Again")
    model.script(hang)
    run_id = (await client.runs.create(thread_id, "agent", input=said("three")))["run_id"]
    await _leave_once_answering(
        client.runs.join_stream(thread_id, run_id, cancel_on_disconnect=True, stream_mode="messages-tuple"),
        hang,
    )
    assert (await run_status(client, thread_id, run_id, "interrupted", "success"))["status"] == "interrupted"

    # A wait has no stream to leave: refused by name, nothing created (runs.wait raises httpx's
    # error, of which the SDK's are subclasses).
    runs = await client.runs.list(thread_id)
    with pytest.raises(httpx.HTTPStatusError, match="422") as refused:
        await client.runs.wait(thread_id, "agent", input=said("four"), on_disconnect="cancel")
    assert "on_disconnect 'cancel'" in refused.value.response.json()["error"]["message"]
    assert await client.runs.list(thread_id) == runs


@shared_stack
async def test_multitask_reject_or_interrupt(client: LangGraphClient, model: FakeOllama) -> None:
    hang = Hang(text="Working on it")
    model.script(hang, Text("Instead, this."))
    thread_id = (await client.threads.create())["thread_id"]
    first = await client.runs.create(thread_id, "agent", input=said("slowly"))
    await hang.wait_started_async(20)
    with pytest.raises(ConflictError):
        await client.runs.create(thread_id, "agent", input=said("two"), multitask_strategy="reject")
    # enqueue: tests/test_agent_protocol_enqueue.py; rollback: tests/test_agent_protocol_forks.py.
    strategy: Any = "later"  # not one of the SDK's four
    with pytest.raises(UnprocessableEntityError, match="multitask_strategy"):
        await client.runs.create(thread_id, "agent", input=said("two"), multitask_strategy=strategy)
    assert (await client.runs.get(thread_id, first["run_id"]))["status"] == "running"

    # interrupt: the run holding the thread is cancelled, then the new one starts.
    second = await client.runs.create(
        thread_id, "agent", input=said("instead"), multitask_strategy="interrupt"
    )
    assert second["multitask_strategy"] == "interrupt"
    assert (await client.runs.get(thread_id, first["run_id"]))["status"] == "interrupted"
    values = await client.runs.join(thread_id, second["run_id"])
    texts = [text_of(m) for m in values["messages"]]
    # The cut answer keeps what had streamed when the interrupt came (all of it, or less).
    assert texts[0] == "slowly" and "Working on it".startswith(texts[1]), texts
    assert texts[2:] == ["instead", "Instead, this."]
    # On an idle thread it simply starts the run.
    model.script(Text("Idle start."))
    values = await wait(client, thread_id, "again", multitask_strategy="interrupt")
    assert text_of(values["messages"][-1]) == "Idle start."


@shared_stack
async def test_the_javascript_sdk_streams_and_rejoins_a_run(stack: SophosEnv, model: FakeOllama) -> None:
    model.script(Text("Hello from Sophos, in JavaScript."))
    out = await run_js("stream_a_run.mjs", stack.api_url, "hi from node")
    thread_id, run_id = out["thread"]["thread_id"], out["created"][0]["run_id"]
    assert out["created"] == [{"run_id": run_id, "thread_id": thread_id}]  # from Content-Location
    streamed = out["streamed"]
    events = [p["event"] for p in streamed]
    assert events[0] == "metadata" and events[-2:] == ["values", "end"]
    tokens = "".join(p["data"][0]["content"] for p in streamed if p["event"] == "messages")
    assert tokens == "Hello from Sophos, in JavaScript."
    assert [text_of(m) for m in streamed[-2]["data"]["messages"]] == ["hi from node", tokens]
    ids = [p["id"] for p in streamed[1:]]
    assert None not in ids and len(set(ids)) == len(ids)
    # "-1": all of it, beginning with metadata as the stream did
    assert out["rejoined"] == [{"event": p["event"], "id": p["id"]} for p in streamed]
    assert out["state"]["values"] == streamed[-2]["data"] and out["run"]["status"] == "success"
    assert out["thread"]["metadata"] == {"via": "js", "owner": "local"}
