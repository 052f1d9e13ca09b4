"""Assistants: configurations of the one agent (docs/agent-protocol.md, "Assistants"), driven by the
real ``langgraph-sdk`` client against a real API and worker, once on SQLite and once on
PostgreSQL (one stack per engine for the module). The fake model records what it was asked: the
system prompt, the model and the tools a run of an assistant was given."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import ConflictError, NotFoundError, UnprocessableEntityError

from shared.contracts.protocol import ASSISTANT_ID
from tests.fakes.ollama import FakeOllama, Hang, Text, ToolCalls
from tests.support.agent_protocol import said
from tests.support.client import read_sse, wait_for_async
from tests.support.env import SYSTEM_PROMPT, SophosEnv
from tests.support.http import http_client
from tests.support.js_sdk import run_js
from tests.support.postgres import engine_overrides
from tests.support.stacks import Stack, own_redis_stack

#: the tests on the module's shared stack run in one xdist worker, which starts it once
shared_stack = pytest.mark.xdist_group("test_agent_protocol_assistants")
APPROVE = {"resume": {"decisions": [{"type": "approve"}]}}


def system_prompt(request: dict[str, Any]) -> str | None:
    """The system prompt the model was asked with (None: none)."""
    first = request["messages"][0]
    return str(first["content"]) if first["role"] == "system" else None


def tools_offered(request: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in request.get("tools") or []}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, fake_ollama: FakeOllama
) -> Iterator[Stack]:
    """One API and worker per engine for the module, on a Redis of its own."""
    root = tmp_path_factory.mktemp(f"assistants-{request.param}")
    with own_redis_stack(root, fake_ollama, **engine_overrides(request, request.param)) as started:
        yield started


@pytest.fixture(scope="module")
def stack(service: Stack) -> SophosEnv:
    return service.env


@shared_stack
async def test_assistants_are_created_versioned_searched_and_deleted(client: LangGraphClient) -> None:
    made = await client.assistants.create(
        "agent", context={"system_prompt": "You are a terse pirate.", "model": "test-model"},
        metadata={"team": "ships", "tier": 1}, name="Pirate", description="arr",
    )
    pirate = made["assistant_id"]
    assert (made["version"], made["name"], made["graph_id"]) == (1, "Pirate", "agent")
    assert made["context"] == {"system_prompt": "You are a terse pirate.", "model": "test-model"}
    assert await client.assistants.get(pirate) == made
    schemas = await client.assistants.get_schemas(pirate)
    assert set(schemas["context_schema"]["properties"]) == {
        "system_prompt", "model", "tools", "require_approval", "configurable"}

    # An update is a new version, made the latest: the fields given replace, metadata merges.
    updated = await client.assistants.update(
        pirate, context={"system_prompt": "You are a polite pirate."}, metadata={"tier": 2}
    )
    assert updated["version"] == 2 and updated["context"] == {"system_prompt": "You are a polite pirate."}
    assert updated["metadata"] == {"team": "ships", "tier": 2} and updated["name"] == "Pirate"
    versions = await client.assistants.get_versions(pirate)
    assert [v["version"] for v in versions] == [2, 1]
    assert [v["version"] for v in await client.assistants.get_versions(pirate, metadata={"tier": 1})] == [1]
    back = await client.assistants.set_latest(pirate, 1)
    assert back["version"] == 1 and back["context"]["system_prompt"] == "You are a terse pirate."
    assert (await client.assistants.get(pirate))["version"] == 1
    with pytest.raises(NotFoundError):
        await client.assistants.set_latest(pirate, 7)

    # Search and count: metadata, graph id, name, sort, offset and limit; the default among them.
    other = (await client.assistants.create("agent", name="Librarian", metadata={"team": "books"}))
    assert [a["assistant_id"] for a in await client.assistants.search(metadata={"team": "ships"})] == [pirate]
    assert [a["name"] for a in await client.assistants.search(name="libr")] == ["Librarian"]
    named = await client.assistants.search(sort_by="name", sort_order="asc", limit=10)
    assert [a["name"] for a in named] == ["Librarian", "Pirate", "agent"]
    page = await client.assistants.search(sort_by="name", sort_order="asc", limit=1, offset=1,
                                          response_format="object")
    assert [a["name"] for a in page["assistants"]] == ["Pirate"] and page["next"] == "2"
    assert await client.assistants.search(graph_id="other") == []
    assert await client.assistants.count() == 3
    assert await client.assistants.count(metadata={"team": "books"}) == 1

    # What an assistant says is checked, naming the field; an id is taken once.
    with pytest.raises(UnprocessableEntityError, match="temperature"):
        await client.assistants.create("agent", context={"temperature": 2})
    with pytest.raises(UnprocessableEntityError, match="configurable"):
        await client.assistants.create("agent", context={"configurable": ["require_approval"]})
    with pytest.raises(ConflictError):
        await client.assistants.create("agent", assistant_id=pirate)
    kept = await client.assistants.create("agent", assistant_id=pirate, if_exists="do_nothing")
    assert kept["version"] == 1

    # The default is config/'s: not deleted, not changed.
    for refused in (client.assistants.delete("agent"), client.assistants.update("agent", name="x")):
        with pytest.raises(ConflictError, match="default assistant"):
            await refused
    with pytest.raises(UnprocessableEntityError, match="delete_threads"):
        await client.assistants.delete(pirate, delete_threads=True)
    await client.assistants.delete(other["assistant_id"])
    await client.assistants.delete(pirate)
    with pytest.raises(NotFoundError):
        await client.assistants.get(pirate)
    assert [a["graph_id"] for a in await client.assistants.search()] == ["agent"]


@shared_stack
async def test_the_javascript_sdk_versions_searches_runs_and_deletes_an_assistant(
    stack: SophosEnv, model: FakeOllama
) -> None:
    model.script(Text("Arr, from node."))
    tag = str(uuid.uuid4())
    out = await run_js("assistants.mjs", stack.api_url, tag, "hi from node")
    made, updated = out["created"], out["updated"]
    pirate = made["assistant_id"]
    assert (made["version"], made["name"], made["graph_id"]) == (1, "JS Pirate", "agent")
    assert made["context"] == {"system_prompt": "You are a terse JS pirate.", "model": "test-model"}
    assert (updated["assistant_id"], updated["version"], updated["name"]) == (pirate, 2, "JS Pirate")
    assert updated["context"] == {"system_prompt": "You are a polite JS pirate."}
    assert updated["metadata"] == {"tag": tag, "tier": 2}
    assert [v["version"] for v in out["versions"]] == [2, 1]
    # includePagination reads X-Pagination-Next: one of the two, the next page at 1
    assert [a["name"] for a in out["page"]["assistants"]] == ["JS Other"] and out["page"]["next"] == "1"
    assert [a["assistant_id"] for a in out["byName"]] == [pirate]
    assert out["counted"] == {"tagged": 2, "tier2": 1}

    # The run was the assistant's latest version: its prompt, its model.
    assert [m["content"] for m in out["values"]["messages"]] == ["hi from node", "Arr, from node."]
    asked = model.requests[-1]
    assert system_prompt(asked) == "You are a polite JS pirate." and asked["model"] == "test-model"
    assert [r["assistant_id"] for r in out["runs"]] == [pirate]
    latest = out["latest"]
    assert latest["version"] == 1 and latest["context"]["system_prompt"] == "You are a terse JS pirate."
    assert out["gone"] == {"status": 404} and out["left"] == 0


@shared_stack
async def test_a_run_is_the_agent_its_assistant_configures(
    client: LangGraphClient, model: FakeOllama, stack: SophosEnv
) -> None:
    model.models = ["test-model:latest", "other-model:latest"]
    helper = (await client.assistants.create(
        "agent", context={"system_prompt": "You are Helper.", "tools": ["tools__echo"],
                          "configurable": ["system_prompt", "model"]},
    ))["assistant_id"]
    thread_id = (await client.threads.create())["thread_id"]

    model.script(Text("Ahoy."))
    values = await client.runs.wait(thread_id, helper, input=said("hello"))
    assert values["messages"][-1]["content"] == "Ahoy."
    asked = model.requests[-1]
    assert system_prompt(asked) == "You are Helper." and asked["model"] == "test-model"
    assert tools_offered(asked) == {"tools__echo"}  # only the tools it may use
    model.script(ToolCalls([("tools__add", {"a": 1, "b": 2})]), Text("Could not."))
    values = await client.runs.wait(thread_id, helper, input=said("add anyway"))
    refused = values["messages"][-2]
    assert refused["type"] == "tool" and "not a valid tool" in refused["content"], refused
    assert "add" not in (stack.tools_log.read_text() if stack.tools_log.exists() else "")

    # A run's context overrides what the assistant marks configurable, and nothing else.
    model.script(Text("Hm."))
    await client.runs.wait(thread_id, helper, input=said("again"),
                           context={"system_prompt": "You are Overridden.", "model": "other-model"})
    asked = model.requests[-1]
    assert system_prompt(asked) == "You are Overridden." and asked["model"] == "other-model"
    with pytest.raises(UnprocessableEntityError, match="tools"):
        await client.runs.create(thread_id, helper, input=said("no"), context={"tools": []})
    assert {r["assistant_id"] for r in await client.runs.list(thread_id)} == {helper}
    # The thread says whose its latest run was, as the Agent Server's does (agent-chat-ui lists
    # the threads of an assistant chosen by its id by this).
    assert (await client.threads.get(thread_id))["metadata"]["assistant_id"] == helper
    helpers = await client.threads.search(metadata={"assistant_id": helper})
    assert [t["thread_id"] for t in helpers] == [thread_id]

    # The default, `agent`: config/'s prompt and every tool; its prompt and model are configurable.
    model.script(Text("Plain."))
    await client.runs.wait(thread_id, "agent", input=said("plain"))
    asked = model.requests[-1]
    assert system_prompt(asked) == SYSTEM_PROMPT and {"tools__echo", "tools__add"} <= tools_offered(asked)
    model.script(Text("Short."))
    await client.runs.wait(thread_id, "agent", input=said("short"), config={"configurable": {
        "system_prompt": "Be short."}})
    assert system_prompt(model.requests[-1]) == "Be short."
    assert (await client.threads.get(thread_id))["metadata"]["assistant_id"] == ASSISTANT_ID
    with pytest.raises(NotFoundError):
        await client.runs.create(thread_id, "7b8e3b5c-0000-4000-8000-000000000000", input=said("x"))


@shared_stack
async def test_an_assistants_approvals_hold_and_its_resume_keeps_its_configuration(
    client: LangGraphClient, model: FakeOllama, stack: SophosEnv
) -> None:
    careful = (await client.assistants.create(
        "agent", context={"system_prompt": "You are Careful.", "require_approval": ["tools__add"]},
    ))["assistant_id"]
    thread_id = (await client.threads.create())["thread_id"]
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), Text("Five."))
    await client.runs.wait(thread_id, careful, input=said("add 2 and 3"))
    state = await client.threads.get_state(thread_id)
    requests = state["tasks"][0]["interrupts"][0]["value"]["action_requests"]
    assert [r["name"] for r in requests] == ["tools__add"]  # asked: mcp.json does not, the assistant does
    calls = len(model.requests)

    values = await client.runs.wait(thread_id, careful, command=APPROVE)
    assert values["messages"][-1]["content"] == "Five."
    assert system_prompt(model.requests[calls]) == "You are Careful."  # the resume is the same agent


@shared_stack
def test_a_conversation_begun_with_an_assistant_keeps_it(stack: SophosEnv, model: FakeOllama) -> None:
    """The page and the CLI name an assistant for a new conversation (POST /api/chat ``assistant``);
    the conversation's next messages are that assistant's too."""
    with http_client(base_url=stack.api_url, timeout=30) as http:
        made = http.post("/assistants", json={"graph_id": "agent",
                                              "context": {"system_prompt": "You are Poet."}})
        poet = made.json()["assistant_id"]
        model.script(Text("Roses."), Text("Violets."), Text("Tulips."))
        accepted = http.post("/api/chat", json={"message": "a poem", "assistant": poet}).json()
        assert read_sse(stack.api_url, accepted["conversation"])[-1].event == "end"
        assert system_prompt(model.requests[-1]) == "You are Poet."
        again = http.post("/api/chat", json={"message": "more", "conversation": accepted["conversation"]})
        assert read_sse(stack.api_url, again.json()["conversation"])[-1].event == "end"
        assert system_prompt(model.requests[-1]) == "You are Poet."
        told = subprocess.run(
            [sys.executable, "-m", "sophos_cli", "chat", "--assistant", poet, "one more poem"],
            env={**stack, "SOPHOS_URL": stack.api_url},
            capture_output=True, text=True, timeout=60,
        )
        assert told.returncode == 0 and "Tulips." in told.stdout, told.stderr
        assert system_prompt(model.requests[-1]) == "You are Poet."
        unknown = http.post("/api/chat", json={"message": "x", "assistant": "nobody"})
        assert unknown.status_code == 404 and "nobody" in unknown.json()["error"]["message"]
        assert http.delete(f"/assistants/{poet}").status_code == 204


@shared_stack
async def test_a_run_of_an_assistant_cut_by_a_crash_resumes_as_that_assistant(
    client: LangGraphClient, model: FakeOllama, service: Stack
) -> None:
    durable = (await client.assistants.create("agent", context={"system_prompt": "You are Durable."}))
    thread_id = (await client.threads.create())["thread_id"]
    hang = Hang(text="half an ")
    model.script(hang, Text("answer, after the crash."))
    run = await client.runs.create(thread_id, durable["assistant_id"], input=said("go"))
    await hang.wait_started_async(20)
    service.worker.kill()
    assert service.worker.wait(10) == -signal.SIGKILL
    service.worker = service.group.start_worker(service.env)

    async def interrupted() -> bool:
        return (await client.runs.get(thread_id, run["run_id"]))["status"] == "interrupted"

    await wait_for_async(interrupted, timeout=30, message="the crashed run recorded interrupted")
    # A resume that names no assistant (the page's, the CLI's) is the agent the run was.
    resumed = await client.http.post("/api/chat", json={"resume": True, "conversation": thread_id})
    values = await client.runs.join(thread_id, resumed["run"])
    assert values["messages"][-1]["content"] == "answer, after the crash."
    assert system_prompt(model.requests[-1]) == "You are Durable."
