"""Forks (``checkpoint_id``) and rollbacks through the Agent Protocol (docs/agent-protocol.md,
"Forks and rollbacks"), driven by the real ``langgraph-sdk`` client against a real API and worker
with the fake model: a run from an earlier checkpoint, a bad checkpoint refused, and
``rollback`` as a multitask strategy and as a cancel action."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import ConflictError, NotFoundError, UnprocessableEntityError

from tests.fakes.ollama import FakeOllama, Hang, Text, ToolCalls
from tests.support.agent_protocol import said
from tests.support.client import get_json
from tests.support.env import SophosEnv
from tests.support.stacks import approval_stack

#: the tests on the module's shared stack run in one xdist worker, which starts it once
shared_stack = pytest.mark.xdist_group("test_agent_protocol_forks")


def texts(values: Any) -> list[str]:
    messages = values.get("messages", []) if isinstance(values, dict) else []
    return [m["content"] if isinstance(m["content"], str) else "".join(
        b.get("text", "") for b in m["content"]) for m in messages]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, fake_ollama: FakeOllama) -> Iterator[SophosEnv]:
    """One API and worker for the module, on a Redis of its own. The fake tools server's ``add``
    asks for approval."""
    with approval_stack(tmp_path_factory.mktemp("protocol-forks"), fake_ollama) as env:
        yield env


async def answered(client: LangGraphClient, thread_id: str, text: str, **options: Any) -> list[str]:
    values = await client.runs.wait(thread_id, "agent", input=said(text), **options)
    return texts(values)


async def history(client: LangGraphClient, thread_id: str) -> list[dict[str, Any]]:
    return [dict(s) for s in await client.threads.get_history(thread_id, limit=1000)]


def ending_with(states: list[dict[str, Any]], text: str) -> dict[str, Any]:
    """The newest checkpoint whose last message is ``text`` and that has nothing left to run."""
    return next(s for s in states if texts(s["values"])[-1:] == [text] and not s["next"])


@shared_stack
async def test_a_run_from_an_earlier_checkpoint_forks_the_thread(
    client: LangGraphClient, model: FakeOllama, stack: SophosEnv
) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    model.script(Text("First."), Text("Second."))
    await answered(client, thread_id, "one")
    assert await answered(client, thread_id, "two") == ["one", "First.", "two", "Second."]
    before = await history(client, thread_id)
    after_first = ending_with(before, "First.")

    # A new message from the checkpoint after the first answer: a new branch.
    model.script(Text("Another second."))
    fork_at = after_first["checkpoint"]["checkpoint_id"]
    run = await client.runs.create(thread_id, "agent", input=said("two, again"), checkpoint_id=fork_at)
    values = texts(await client.runs.join(thread_id, run["run_id"]))
    assert values == ["one", "First.", "two, again", "Another second."]
    state = await client.threads.get_state(thread_id)
    assert texts(state["values"]) == values
    assert texts((await client.threads.get(thread_id))["values"]) == values

    # The history keeps both branches, newest first, each checkpoint with its parent; the new
    # branch's checkpoints descend from the fork point.
    after = await history(client, thread_id)
    assert after[0]["checkpoint"] == state["checkpoint"]
    ids = [s["checkpoint"]["checkpoint_id"] for s in after]
    assert ids == sorted(ids, reverse=True) and set(ids) > {s["checkpoint"]["checkpoint_id"] for s in before}
    assert ending_with(after, "Second.")["checkpoint"] == ending_with(before, "Second.")["checkpoint"]
    parents = {
        s["checkpoint"]["checkpoint_id"]: (s["parent_checkpoint"] or {}).get("checkpoint_id") for s in after
    }
    node: str | None = state["checkpoint"]["checkpoint_id"]
    path = []
    while node is not None:
        path.append(node)
        node = parents[node]
    assert fork_at in path
    assert ending_with(before, "Second.")["checkpoint"]["checkpoint_id"] not in path
    # The web page's view of the conversation: the same branch, with the other one beside it.
    detail = get_json(stack.api_url, f"/api/conversations/{thread_id}")
    assert detail is not None
    assert [m["content"] for m in detail["messages"]] == values
    assert [m["branch"]["count"] for m in detail["messages"] if m.get("branch")] == [2]

    # No input from a checkpoint with a step still to run (`checkpoint`, as agent-chat-ui sends
    # it), streamed: that step runs again there, another answer to the same message.
    asked = next(
        s for s in after if s["next"] == ["agent"] and texts(s["values"]) == ["one", "First.", "two"]
    )
    model.script(Text("A third second."))
    stream = client.runs.stream(thread_id, "agent", checkpoint=asked["checkpoint"], stream_mode="values")
    parts = [p async for p in stream]
    assert [p.event for p in parts] == ["metadata", "values", "end"]
    values = texts(parts[1].data)
    assert values == ["one", "First.", "two", "A third second."]
    assert texts((await client.threads.get_state(thread_id))["values"]) == values
    assert ending_with(await history(client, thread_id), "Another second.")  # still there


@shared_stack
async def test_a_bad_checkpoint_is_refused_and_changes_nothing(
    client: LangGraphClient, model: FakeOllama
) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    empty = (await client.threads.create())["thread_id"]
    model.script(Text("Only answer."))
    await answered(client, thread_id, "one")
    state = await client.threads.get_state(thread_id)
    states = await history(client, thread_id)
    runs = await client.runs.list(thread_id)

    unknown = str(uuid.uuid4())
    with pytest.raises(NotFoundError, match=f"checkpoint {unknown}"):
        await client.runs.create(thread_id, "agent", input=said("two"), checkpoint_id=unknown)
    with pytest.raises(NotFoundError, match="checkpoint"):
        await client.runs.create(empty, "agent", input=said("two"), checkpoint={"checkpoint_id": unknown})
    with pytest.raises(UnprocessableEntityError, match="checkpoint id"):
        await client.runs.create(thread_id, "agent", input=said("two"), checkpoint_id="not an id!")
    with pytest.raises(UnprocessableEntityError, match="different checkpoints"):
        await client.runs.create(
            thread_id, "agent", input=said("two"), checkpoint_id=unknown,
            checkpoint={"checkpoint_id": state["checkpoint"]["checkpoint_id"]},
        )
    with pytest.raises(UnprocessableEntityError, match="subgraphs"):
        await client.runs.create(
            thread_id, "agent", input=said("two"), checkpoint={**state["checkpoint"], "checkpoint_ns": "sub"}
        )
    # Decisions continue the thread where it waits: with its head (as useStream sends it), the
    # same answer as without a checkpoint; with any other checkpoint, refused.
    with pytest.raises(UnprocessableEntityError, match="not the head"):
        await client.runs.create(
            thread_id, "agent", checkpoint_id=states[-1]["checkpoint"]["checkpoint_id"],
            command={"resume": {"decisions": [{"type": "approve"}]}},
        )
    with pytest.raises(ConflictError, match="waits for no decision"):
        await client.runs.create(
            thread_id, "agent", checkpoint_id=state["checkpoint"]["checkpoint_id"],
            command={"resume": {"decisions": [{"type": "approve"}]}},
        )
    # A run that would wait starts from the thread as its turn finds it, not from a checkpoint.
    with pytest.raises(UnprocessableEntityError, match="enqueue"):
        await client.runs.create(
            thread_id, "agent", input=said("two"), checkpoint_id=state["checkpoint"]["checkpoint_id"],
            multitask_strategy="enqueue",
        )
    # No input from a checkpoint with nothing left to run: nothing to resume there.
    with pytest.raises(ConflictError, match="nothing to resume"):
        await client.runs.create(thread_id, "agent", checkpoint_id=state["checkpoint"]["checkpoint_id"])

    assert await client.threads.get_state(thread_id) == state
    assert await history(client, thread_id) == states
    assert await client.runs.list(thread_id) == runs
    assert await client.threads.get_history(empty) == []


@shared_stack
async def test_no_fork_over_a_decision(client: LangGraphClient, model: FakeOllama) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    model.script(Text("First."), ToolCalls([("tools__add", {"a": 2, "b": 3})]))
    await answered(client, thread_id, "one")
    await client.runs.wait(thread_id, "agent", input=said("add 2 and 3"))
    waiting = await client.threads.get_state(thread_id)
    assert waiting["next"] == ["approval"]
    after_first = ending_with(await history(client, thread_id), "First.")["checkpoint"]["checkpoint_id"]
    # While the thread waits for a decision, it takes no fork (as on the web page)...
    with pytest.raises(ConflictError, match="decision"):
        await client.runs.create(thread_id, "agent", input=said("other"), checkpoint_id=after_first)
    model.script(Text("The sum is 5."))
    approve: Any = {"resume": {"decisions": [{"type": "approve"}]}}
    decided = await client.runs.wait(thread_id, "agent", command=approve)
    assert texts(decided)[-1] == "The sum is 5."
    # ... and a checkpoint that waits for one takes no run: it would abandon the decision.
    for graph_input in (said("other"), None):
        with pytest.raises(ConflictError, match="waits for a decision"):
            await client.runs.create(
                thread_id, "agent", input=graph_input, checkpoint_id=waiting["checkpoint"]["checkpoint_id"]
            )
    assert texts((await client.threads.get_state(thread_id))["values"])[-1] == "The sum is 5."
    # Decided, the thread forks again.
    model.script(Text("Other."))
    values = await answered(client, thread_id, "other", checkpoint_id=after_first)
    assert values == ["one", "First.", "other", "Other."]


async def _hanging(client: LangGraphClient, model: FakeOllama, thread_id: str) -> tuple[str, Hang]:
    """A run of ``slowly`` whose answer hangs mid-way (its message already recorded)."""
    hang = Hang(text="Working on it")
    model.script(hang)
    run = await client.runs.create(thread_id, "agent", input=said("slowly"))
    await hang.wait_started_async(20)
    return run["run_id"], hang


@shared_stack
async def test_rollback_as_a_multitask_strategy(client: LangGraphClient, model: FakeOllama) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    model.script(Text("First."))
    await answered(client, thread_id, "one")
    cancelled, _ = await _hanging(client, model, thread_id)

    model.script(Text("Instead, this."))
    run = await client.runs.create(thread_id, "agent", input=said("instead"), multitask_strategy="rollback")
    assert run["multitask_strategy"] == "rollback"
    values = texts(await client.runs.join(thread_id, run["run_id"]))
    # As if the cancelled run had not happened: its message and cut answer are not on the branch.
    assert values == ["one", "First.", "instead", "Instead, this."]
    assert texts((await client.threads.get_state(thread_id))["values"]) == values
    # The cancelled run stays, interrupted; its checkpoints stay, as an abandoned branch.
    assert (await client.runs.get(thread_id, cancelled))["status"] == "interrupted"
    assert [r["run_id"] for r in await client.runs.list(thread_id)][:2] == [run["run_id"], cancelled]
    assert any("slowly" in texts(s["values"]) for s in await history(client, thread_id))

    # The thread's first run: the new message takes its place.
    first_thread = (await client.threads.create())["thread_id"]
    cancelled, _ = await _hanging(client, model, first_thread)
    model.script(Text("From the start."))
    values = await answered(client, first_thread, "instead", multitask_strategy="rollback")
    assert values == ["instead", "From the start."]
    assert (await client.runs.get(first_thread, cancelled))["status"] == "interrupted"
    assert any("slowly" in texts(s["values"]) for s in await history(client, first_thread))
    # On an idle thread it simply starts the run; a rollback needs a new message.
    model.script(Text("Idle start."))
    assert (await answered(client, first_thread, "again", multitask_strategy="rollback"))[-1] == "Idle start."
    with pytest.raises(UnprocessableEntityError, match="rollback takes a run with input"):
        await client.runs.create(first_thread, "agent", multitask_strategy="rollback")


@shared_stack
async def test_rollback_as_a_cancel_action(
    client: LangGraphClient, model: FakeOllama, stack: SophosEnv
) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    model.script(Text("First."))
    before = await answered(client, thread_id, "one")
    cancelled, _ = await _hanging(client, model, thread_id)

    await client.runs.cancel(thread_id, cancelled, action="rollback")
    # Answered once done: the run cancelled, the thread back where that run started.
    assert (await client.runs.get(thread_id, cancelled))["status"] == "interrupted"
    thread = await client.threads.get(thread_id)
    assert thread["status"] == "idle" and texts(thread["values"]) == before
    state = await client.threads.get_state(thread_id)
    assert texts(state["values"]) == before
    # The protocol's run list shows the runs the client made; the rollback's switch run is on
    # Sophos's own list.
    assert [r["status"] for r in await client.runs.list(thread_id)] == ["interrupted", "success"]
    native = get_json(stack.api_url, f"/api/runs?conversation={thread_id}")
    assert native is not None and [r["kind"] for r in native["runs"]] == ["switch", "run", "run"]
    # The cancelled run's checkpoints stay, newer than the state the thread is back at.
    states = await history(client, thread_id)
    assert "slowly" in texts(states[0]["values"]) and state["checkpoint"] in [s["checkpoint"] for s in states]
    # The next run starts from there.
    model.script(Text("Next."))
    assert await answered(client, thread_id, "next") == [*before, "next", "Next."]
    listed = await client.runs.list(thread_id, limit=2)  # a page past the switch run is still full
    assert [r["status"] for r in listed] == ["success", "interrupted"]
    finished = listed[0]["run_id"]
    with pytest.raises(ConflictError):  # a finished run is not cancelled, nor rolled back
        await client.runs.cancel(thread_id, finished, action="rollback")

    # The thread's first run has nothing before it: refused, and it goes on.
    first_thread = (await client.threads.create())["thread_id"]
    running, hang = await _hanging(client, model, first_thread)
    with pytest.raises(UnprocessableEntityError, match="first"):
        await client.runs.cancel(first_thread, running, action="rollback")
    assert (await client.runs.get(first_thread, running))["status"] == "running"
    hang.release()
    assert texts(await client.runs.join(first_thread, running)) == ["slowly", "Working on it"]
    # (An unknown action means interrupt: tests/test_agent_protocol_defaults.py.)
