"""The rest of the Agent Protocol's surface (docs/agent-protocol.md), driven by the real
``langgraph-sdk`` client against a real API and worker with the fake model, on one stack for the
module: the step stream modes (``messages``, ``tasks``, ``checkpoints``, ``debug``, ``events``)
runs without a thread (``on_completion`` ``delete`` and ``keep``), ``update_state``, ``command``
``goto`` and ``update``, breakpoints, ``after_seconds`` across a restart, ``threads.prune`` and
``threads.copy``; and the same flows driven by the JavaScript SDK (tests/js/rest.mjs)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import APIStatusError, NotFoundError

from tests.fakes.ollama import FakeOllama, Hang, Text, ToolCalls
from tests.support.agent_protocol import said
from tests.support.client import wait_for_async
from tests.support.env import SophosEnv
from tests.support.http import async_http_client
from tests.support.js_sdk import run_js
from tests.support.stacks import Stack, own_redis_stack

shared_stack = pytest.mark.xdist_group("test_agent_protocol_rest")


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory, fake_ollama: FakeOllama) -> Iterator[Stack]:
    """The module's worker and API, on a Redis of their own (as tests/support/stacks.py's
    approval_stack), the processes at hand: a test restarts them."""
    with own_redis_stack(tmp_path_factory.mktemp("rest"), fake_ollama, approval=["add"]) as started:
        yield started


@pytest.fixture(scope="module")
def stack(whole: Stack) -> SophosEnv:
    return whole.env


@shared_stack
async def test_the_step_stream_modes_in_the_sdks_shapes(client: LangGraphClient, model: FakeOllama) -> None:
    model.script(ToolCalls([("tools__echo", {"text": "ping"})]), Text("Echoed."))
    thread_id = (await client.threads.create())["thread_id"]
    modes: Any = ["messages", "tasks", "checkpoints", "debug", "events"]
    parts = [p async for p in client.runs.stream(
        thread_id, "agent", input=said("echo ping"), stream_mode=modes,
    )]
    assert parts[0].event == "metadata" and parts[-1].event == "end"
    state = await client.threads.get_state(thread_id)
    stored = {m["id"]: m for m in state["values"]["messages"]}

    # messages: metadata before each message, the answer's partials, then each message complete.
    complete = [m for p in parts if p.event == "messages/complete" for m in p.data]
    assert [m["type"] for m in complete] == ["ai", "tool", "ai"]
    assert {m["id"] for m in complete} <= set(stored)
    assert complete[0]["tool_calls"][0]["name"] == "tools__echo" and complete[-1]["content"] == "Echoed."
    partials = [p.data[0] for p in parts if p.event == "messages/partial"]
    assert partials and partials[-1]["content"] == "Echoed." and partials[-1]["id"] == complete[-1]["id"]
    announced = {k for p in parts if p.event == "messages/metadata" for k in p.data}
    assert announced == {m["id"] for m in complete}

    # tasks: each node's start and result, with LangGraph's task ids.
    tasks = [p.data for p in parts if p.event == "tasks"]
    starts = [t for t in tasks if "triggers" in t]
    results = [t for t in tasks if "result" in t]
    assert [t["name"] for t in starts] == [t["name"] for t in results] == ["agent", "tools", "agent"]
    assert [t["id"] for t in starts] == [t["id"] for t in results]
    assert results[1]["result"]["messages"][0]["content"] and results[-1]["error"] is None

    # checkpoints: after each step and at the end, the last one the thread's state.
    checkpoints = [p.data for p in parts if p.event == "checkpoints"]
    assert len(checkpoints) == 4  # its input taken, the model's turn, the tool, the answer (the end)
    last = checkpoints[-1]
    assert last["config"]["configurable"]["checkpoint_id"] == state["checkpoint"]["checkpoint_id"]
    assert last["values"] == state["values"] and last["next"] == [] and last["metadata"]["step"] >= 3
    assert [c["next"] for c in checkpoints[:3]] == [["agent"], ["tools"], ["agent"]]
    history = await client.threads.get_history(thread_id, limit=20)
    assert {c["config"]["configurable"]["checkpoint_id"] for c in checkpoints} <= {
        h["checkpoint"]["checkpoint_id"] for h in history
    }

    # debug: the same checkpoints, task starts and results, wrapped.
    debug = [p.data for p in parts if p.event == "debug"]
    assert [d["type"] for d in debug].count("checkpoint") == 4
    assert [d["payload"]["id"] for d in debug if d["type"] == "task"] == [t["id"] for t in starts]

    # events: astream_events of the graph, its nodes, the model's tokens and the tool.
    events = [p.data for p in parts if p.event == "events"]
    assert (events[0]["event"], events[-1]["event"]) == ("on_chain_start", "on_chain_end")
    kinds = {e["event"] for e in events}
    assert {"on_chat_model_stream", "on_chat_model_end", "on_tool_end"} <= kinds
    tokens = "".join(e["data"]["chunk"]["content"] for e in events if e["event"] == "on_chat_model_stream")
    assert tokens == "Echoed."

    # A rejoin from the start tells the same parts (bar debug's task timestamps).
    replay = [p async for p in client.runs.join_stream(
        thread_id, parts[0].data["run_id"], last_event_id="-1", stream_mode=modes,
    )]
    assert [(p.id, p.data) for p in replay if p.event == "checkpoints"] == [
        (p.id, p.data) for p in parts if p.event == "checkpoints"
    ]
    assert [(p.id, p.data) for p in replay if p.event == "tasks"] == [
        (p.id, p.data) for p in parts if p.event == "tasks"
    ]


async def gone(client: LangGraphClient, thread_id: str) -> bool:
    try:
        await client.threads.get(thread_id)
    except NotFoundError:
        return True
    return False


@shared_stack
async def test_runs_without_a_thread(client: LangGraphClient, model: FakeOllama) -> None:
    """A run on a temporary thread: deleted once the run ended (``delete``, the default), or kept."""
    before = await client.threads.count()
    model.script(Text("Waited."))
    values: Any = await client.runs.wait(None, "agent", input=said("hi"))
    assert [m["content"] for m in values["messages"]] == ["hi", "Waited."]
    # At most as many as before: a temporary thread an earlier test of this module left may be
    # deleted meanwhile too (the worker's to delete, later under load), which an exact count missed.
    await wait_for_async(lambda: _count_at_most(client, before), message="the temporary thread deleted")

    model.script(Text("Kept."))
    parts = [p async for p in client.runs.stream(
        None, "agent", input=said("keep it"), on_completion="keep", stream_mode="values",
    )]
    kept = parts[0].data["thread_id"]
    assert parts[-1].event == "end"
    thread = await client.threads.get(kept)
    assert [m["content"] for m in thread["values"]["messages"]] == ["keep it", "Kept."]
    assert await client.threads.count() == before + 1

    model.script(Text("In the background."))
    run = await client.runs.create(None, "agent", input=said("later"))
    assert run["thread_id"] not in (None, kept)
    await wait_for_async(lambda: gone(client, run["thread_id"]), message="the background thread deleted")

    # Refused runs leave no thread behind.
    with pytest.raises(httpx.HTTPStatusError) as conflict:  # nothing to resume on a new thread
        await client.runs.wait(None, "agent", input=None)
    assert conflict.value.response.status_code == 409
    with pytest.raises(httpx.HTTPStatusError) as refused:
        await client.runs.create(None, "agent", input=said("x"), on_completion="later")  # type: ignore[arg-type]
    assert refused.value.response.status_code == 422 and "on_completion" in refused.value.response.text
    assert await client.threads.count() == before + 1


async def _count_at_most(client: LangGraphClient, count: int) -> bool:
    return await client.threads.count() <= count


@shared_stack
async def test_a_run_without_a_thread_has_its_thread_deleted_after_the_api_was_killed(
    client: LangGraphClient, model: FakeOllama, whole: Stack
) -> None:
    """The temporary thread is the worker's to delete (worker/upkeep/expiry.py), not a task of the
    API process that made it: that process killed while the run is held changes nothing."""
    hang = Hang(text="Held.")
    model.script(hang, Text("Kept."))
    run = await client.runs.create(None, "agent", input=said("outlive the api"))
    await hang.wait_started_async()
    # ``keep``: a run of its own (queued behind the held one, or running beside it).
    kept = await client.runs.create(None, "agent", input=said("keep me"), on_completion="keep")
    [api] = [p for p in whole.group.processes if p.module == "api" and p.alive]
    api.kill()
    api.wait(10)
    hang.release()
    whole.group.start_api(whole.env)  # on the same port: the client's
    await wait_for_async(lambda: gone(client, run["thread_id"]), 60, interval=0.2,
                         message="the thread of the run without a thread deleted by the worker")
    async with async_http_client(base_url=whole.api) as http:  # its history with it
        assert (await http.get(f"/api/conversations/{run['thread_id']}")).status_code == 404
    # ``keep``: its thread is still there once its run ended.
    await client.runs.join(kept["thread_id"], kept["run_id"])
    thread = await client.threads.get(kept["thread_id"])
    assert [m["content"] for m in thread["values"]["messages"]] == ["keep me", "Kept."]


def status_of(exc: BaseException) -> tuple[int, str]:
    assert isinstance(exc, httpx.HTTPStatusError | APIStatusError)
    return exc.response.status_code, exc.response.text


@shared_stack
async def test_update_state_corrects_the_thread_as_a_node(client: LangGraphClient, model: FakeOllama) -> None:
    model.script(Text("Helo wrold."))
    thread_id = (await client.threads.create())["thread_id"]
    await client.runs.wait(thread_id, "agent", input=said("greet me"))
    answer = (await client.threads.get_state(thread_id))["values"]["messages"][-1]

    fixed = {"id": answer["id"], "role": "assistant", "content": "Hello world."}
    updated = await client.threads.update_state(thread_id, {"messages": [fixed]}, as_node="agent")
    state = await client.threads.get_state(thread_id)
    assert updated["checkpoint"]["checkpoint_id"] == state["checkpoint"]["checkpoint_id"]
    assert [m["content"] for m in state["values"]["messages"]] == ["greet me", "Hello world."]
    assert state["values"]["messages"][-1]["id"] == answer["id"]  # replaced, not added
    assert state["metadata"]["source"] == "update" and state["next"] == []
    assert len(await client.runs.list(thread_id)) == 1  # the update is no run of the client's

    # The next run continues from the corrected thread.
    model.script(Text("Again."))
    values: Any = await client.runs.wait(thread_id, "agent", input=said("and?"))
    assert [m["content"] for m in values["messages"]] == ["greet me", "Hello world.", "and?", "Again."]

    # Refused while a run holds the thread, by name; nothing changed.
    hang = Hang(text="Busy.")
    model.script(hang)
    run = await client.runs.create(thread_id, "agent", input=said("hold it"))
    await hang.wait_started_async(20)
    with pytest.raises((httpx.HTTPStatusError, APIStatusError)) as busy:
        await client.threads.update_state(thread_id, {"messages": [fixed]}, as_node="agent")
    assert status_of(busy.value)[0] == 409 and "SESSION_IN_PROGRESS" in status_of(busy.value)[1]
    hang.release()
    await client.runs.join(thread_id, run["run_id"])

    for values_, as_node in (({"messages": [fixed]}, "approval"), ({"todo": []}, "agent"),
                             ({"messages": [{"role": "robot", "content": "x"}]}, None)):
        with pytest.raises((httpx.HTTPStatusError, APIStatusError)) as refused:
            await client.threads.update_state(thread_id, values_, as_node=as_node)
        assert status_of(refused.value)[0] == 422, status_of(refused.value)
    last = (await client.threads.get_state(thread_id))["values"]["messages"][-1]
    assert last["content"] == "Busy."


@shared_stack
async def test_a_command_with_goto_and_update_is_a_runs_input(
    client: LangGraphClient, model: FakeOllama
) -> None:
    model.script(Text("First."))
    thread_id = (await client.threads.create())["thread_id"]
    await client.runs.wait(thread_id, "agent", input=said("one"))
    model.script(Text("Went there."))
    update = {"messages": [{"role": "user", "content": "also this"}]}
    values: Any = await client.runs.wait(thread_id, "agent", command={"update": update, "goto": "agent"})
    assert [m["content"] for m in values["messages"]] == ["one", "First.", "also this", "Went there."]
    model.script(Text("Once more."))  # goto alone: the model's turn again
    values = await client.runs.wait(thread_id, "agent", command={"goto": "agent"})
    assert [m["content"] for m in values["messages"]][-1] == "Once more."
    for command in ({"goto": "tools"}, {"update": {"todo": 1}}, {"goto": "agent", "graph": "x"}):
        with pytest.raises((httpx.HTTPStatusError, APIStatusError)) as refused:
            await client.runs.create(thread_id, "agent", command=command)  # type: ignore[arg-type]
        assert status_of(refused.value)[0] == 422, status_of(refused.value)
    assert len(await client.runs.list(thread_id)) == 3


@shared_stack
async def test_a_run_stops_at_a_breakpoint_and_a_run_without_input_resumes_it(
    client: LangGraphClient, model: FakeOllama
) -> None:
    model.script(ToolCalls([("tools__echo", {"text": "ping"})]), Text("Echoed."))
    thread_id = (await client.threads.create())["thread_id"]
    values: Any = await client.runs.wait(thread_id, "agent", input=said("echo"), interrupt_before=["tools"])
    assert [m["type"] for m in values["messages"]] == ["human", "ai"]  # the call asked, not made
    state = await client.threads.get_state(thread_id)
    assert state["next"] == ["tools"] and (await client.threads.get(thread_id))["status"] == "interrupted"
    assert (await client.runs.list(thread_id))[0]["status"] == "success"
    values = await client.runs.wait(thread_id, "agent", input=None)
    assert [m["type"] for m in values["messages"]] == ["human", "ai", "tool", "ai"]
    assert values["messages"][-1]["content"] == "Echoed."

    model.script(ToolCalls([("tools__echo", {"text": "pong"})]), Text("Done."))
    values = await client.runs.wait(thread_id, "agent", input=said("again"), interrupt_after="agent")
    assert values["messages"][-1]["type"] == "ai" and (await client.threads.get_state(thread_id))["next"] == [
        "tools"
    ]
    values = await client.runs.wait(thread_id, "agent")
    assert values["messages"][-1]["content"] == "Done."
    with pytest.raises((httpx.HTTPStatusError, APIStatusError)) as refused:
        await client.runs.create(thread_id, "agent", input=said("x"), interrupt_before=["approval"])
    assert status_of(refused.value)[0] == 422 and "interrupt_before" in status_of(refused.value)[1]


#: a delayed run's delay (seconds)
DELAY = 5


@shared_stack
async def test_a_delayed_run_waits_its_time_across_a_restart(
    client: LangGraphClient, model: FakeOllama, whole: Stack
) -> None:
    model.script(Text("Later."))
    thread_id = (await client.threads.create())["thread_id"]
    run = await client.runs.create(thread_id, "agent", input=said("in a while"), after_seconds=DELAY)
    assert run["status"] == "pending" and (await client.threads.get(thread_id))["status"] == "busy"
    with pytest.raises((httpx.HTTPStatusError, APIStatusError)) as busy:  # it holds the thread meanwhile
        await client.runs.create(thread_id, "agent", input=said("now"), multitask_strategy="reject")
    assert status_of(busy.value)[0] == 409
    async with async_http_client(base_url=whole.api) as http:  # it waits for its time, not a worker
        shown = (await http.get(f"/api/runs/{run['run_id']}")).json()
        assert shown["waitedMs"] == 0, shown

    # The worker and the API killed and started again: the run, kept in Redis, still runs once due.
    for process in [p for p in whole.group.processes if p.alive]:
        process.kill()
        process.wait(10)
    whole.group.start_worker(whole.env)
    whole.group.start_api(whole.env)  # on the same port: the client's

    values: Any = await client.runs.join(thread_id, run["run_id"])
    assert [m["content"] for m in values["messages"]] == ["in a while", "Later."]
    assert (await client.runs.get(thread_id, run["run_id"]))["status"] == "success"
    async with async_http_client(base_url=whole.api) as http:  # started once due, not before
        shown = (await http.get(f"/api/runs/{run['run_id']}")).json()
    waited = datetime.fromisoformat(shown["startedAt"]) - datetime.fromisoformat(shown["enqueuedAt"])
    assert waited.total_seconds() >= DELAY - 0.01, shown
    with pytest.raises((httpx.HTTPStatusError, APIStatusError)) as refused:
        await client.runs.create(thread_id, "agent", input=said("x"), after_seconds=90_000)
    assert status_of(refused.value)[0] == 422 and "after_seconds" in status_of(refused.value)[1]


@shared_stack
async def test_prune_deletes_the_threads_it_names(client: LangGraphClient, model: FakeOllama) -> None:
    model.script(Text("Soon gone."))
    used = (await client.threads.create())["thread_id"]
    await client.runs.wait(used, "agent", input=said("hi"))
    empty = (await client.threads.create())["thread_id"]
    kept = (await client.threads.create())["thread_id"]
    with pytest.raises((httpx.HTTPStatusError, APIStatusError)) as refused:
        await client.threads.prune([used], strategy="keep_latest")
    assert status_of(refused.value)[0] == 422 and "keep_latest" in status_of(refused.value)[1]
    answer = await client.threads.prune([used, empty, used, str(uuid.uuid4())])
    assert answer == {"pruned_count": 2}  # the unknown id is not counted
    assert await gone(client, used) and await gone(client, empty) and not await gone(client, kept)


@shared_stack
async def test_a_cron_in_a_time_zone(client: LangGraphClient) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    cron = await client.crons.create_for_thread(
        thread_id, "agent", schedule="0 9 * * *", timezone="Asia/Tokyo", input=said("good morning"),
    )
    assert cron["schedule"] == "0 9 * * *" and cron["timezone"] == "Asia/Tokyo"
    [found] = await client.crons.search(thread_id=thread_id)
    assert (found["schedule"], found["timezone"]) == ("0 9 * * *", "Asia/Tokyo")
    fires = datetime.fromisoformat(found["next_run_date"])
    assert (fires.hour, fires.minute) == (0, 0)  # 09:00 in Tokyo (UTC+9, no summer time)
    await client.crons.delete(cron["cron_id"])
    with pytest.raises((httpx.HTTPStatusError, APIStatusError)) as refused:
        await client.crons.create_for_thread(thread_id, "agent", schedule="0 9 * * *", timezone="Mars/Base")
    assert status_of(refused.value)[0] == 422 and "Mars/Base" in status_of(refused.value)[1]


@shared_stack
async def test_a_copy_holds_the_threads_history_and_goes_on_apart(
    client: LangGraphClient, model: FakeOllama
) -> None:
    model.script(ToolCalls([("tools__echo", {"text": "ping"})]), Text("Echoed."))
    source = (await client.threads.create(metadata={"topic": "copying"}))["thread_id"]
    await client.runs.wait(source, "agent", input=said("echo ping"))

    # Refused while a run holds the thread, by name.
    hang = Hang(text="Busy.")
    model.script(hang)
    run = await client.runs.create(source, "agent", input=said("hold it"))
    await hang.wait_started_async(20)
    with pytest.raises((httpx.HTTPStatusError, APIStatusError)) as busy:
        await client.threads.copy(source)
    assert status_of(busy.value)[0] == 409 and "SESSION_IN_PROGRESS" in status_of(busy.value)[1]
    hang.release()
    await client.runs.join(source, run["run_id"])

    copied: Any = await client.threads.copy(source)
    copy_id = copied["thread_id"]
    assert copy_id != source and copied["status"] == "idle"
    assert copied["metadata"]["topic"] == "copying" and copied["metadata"]["owner"] == "local"
    before = await client.threads.get_state(source)
    assert copied["values"] == before["values"] and len(before["values"]["messages"]) == 6
    assert (await client.threads.get_state(copy_id))["values"] == before["values"]
    histories = [await client.threads.get_history(t, limit=50) for t in (source, copy_id)]
    ids = [[h["checkpoint"]["checkpoint_id"] for h in history] for history in histories]
    assert ids[0] == ids[1] and len(ids[0]) >= 6
    assert [h["values"] for h in histories[0]] == [h["values"] for h in histories[1]]
    assert [t["thread_id"] for t in await client.threads.search(metadata={"topic": "copying"})] == [
        copy_id, source,
    ]

    assert await client.runs.list(copy_id) == []

    # A run on the copy goes on from its history; the source is as it was.
    model.script(Text("Apart."))
    values: Any = await client.runs.wait(copy_id, "agent", input=said("and now?"))
    assert [m["content"] for m in values["messages"]][-3:] == ["Busy.", "and now?", "Apart."]
    assert await client.threads.get_state(source) == before
    with pytest.raises(NotFoundError):
        await client.threads.copy(str(uuid.uuid4()))


def contents(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages]


@shared_stack
async def test_the_javascript_sdk_drives_the_rest(stack: SophosEnv, model: FakeOllama) -> None:
    """tests/js/rest.mjs: a run without a thread, a stream in ``messages-tuple`` and ``updates``,
    ``updateState`` as ``agent``, ``threads.joinStream`` after an id, crons counted and deleted."""
    model.script(Text("Waited in node."), Text("Helo wrold."), Text("Again."))
    tag = str(uuid.uuid4())
    out = await run_js("rest.mjs", stack.api_url, tag)
    assert contents(out["stateless"]["messages"]) == ["no thread", "Waited in node."]

    thread_id, run_id = out["thread"]["thread_id"], out["created"][0]["run_id"]
    assert out["created"] == [{"run_id": run_id, "thread_id": thread_id}]
    streamed = out["streamed"]
    events = [p["event"] for p in streamed]
    assert (events[0], events[-1]) == ("metadata", "end")
    assert set(events) == {"metadata", "messages", "updates", "end"}
    tokens = [p["data"] for p in streamed if p["event"] == "messages"]
    assert "".join(chunk["content"] for chunk, _ in tokens) == "Helo wrold."
    assert {meta["langgraph_node"] for _, meta in tokens} == {"agent"}
    updates = [p["data"] for p in streamed if p["event"] == "updates"]
    assert [list(u) for u in updates] == [["agent"]]
    answer = updates[0]["agent"]["messages"][-1]
    assert answer["content"] == "Helo wrold."
    assert answer["id"] == out["before"]["values"]["messages"][-1]["id"]  # the stored message

    # updateState as agent: the answer replaced by its id, the new checkpoint the state's.
    state = out["state"]
    assert out["updated"]["checkpoint"]["checkpoint_id"] == state["checkpoint"]["checkpoint_id"]
    assert contents(state["values"]["messages"]) == ["greet me", "Hello world."]
    assert state["values"]["messages"][-1]["id"] == answer["id"] and state["metadata"]["source"] == "update"

    # joinStream after the run's first part: the rest of it, then the next run from its metadata.
    joined = out["joined"]
    ended = [p["event"] for p in joined].index("end") + 1
    assert [(p["event"], p["id"]) for p in joined[:ended]] == [
        (p["event"], f"{run_id}:{p['id']}") for p in streamed[2:]
    ]
    # (a metadata part has no id: the SDK's SSE reader keeps the one before, as EventSource does)
    following, next_id = joined[ended:], out["next"]["run_id"]
    assert following[0]["event"] == "metadata" and following[0]["data"]["run_id"] == next_id
    assert all(p["id"].startswith(f"{next_id}:") for p in following[1:]) and following[-1]["event"] == "end"
    last_values = [p["data"] for p in following if p["event"] == "values"][-1]
    assert contents(last_values["messages"]) == ["greet me", "Hello world.", "and?", "Again."]

    crons = out["crons"]
    assert crons["forThread"]["thread_id"] == thread_id and crons["alone"]["thread_id"] is None
    assert crons["counted"] == {"tagged": 2, "thread": 1} and crons["left"] == 0
    assert [c["cron_id"] for c in crons["found"]] == [crons["forThread"]["cron_id"]]
