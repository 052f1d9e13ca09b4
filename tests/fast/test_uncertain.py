"""Uncertain tool calls go to a person (issue 29, part 4): worker/tools/ledger/ inside the real graph.

No process: the ledger on a SQLite file in the test's directory, the graph on an in-memory
saver with a scripted model. A call is made uncertain as a crash leaves it: its intent is
committed and no outcome follows. Kills of real workers prove the same in tests/test_tool_effects.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import StructuredTool, ToolException
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from shared.contracts.ledger import DONE
from shared.storage.threads.interrupts import interrupt_requests, resume_value
from tests.support.ledger import ledger_on
from worker.agent.graph import build_graph
from worker.tools.ledger.attempt import IDEMPOTENCY_META_KEY, request_meta, unanswered
from worker.tools.ledger.calls import Ledger
from worker.tools.ledger.records import CallRef
from worker.tools.ledger.uncertain import UNCERTAIN_MARK
from worker.tools.policy import SAFE_TO_REPEAT


class _Scripted(GenericFakeChatModel):
    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


class Turn:
    """A turn of three calls: ``send`` twice (not safe to repeat), ``look`` once (safe)."""

    def __init__(self, ledger: Ledger, conversation: str) -> None:
        self.ledger = ledger
        self.conversation = conversation
        #: (tool, arguments, idempotency key) of every request made
        self.sent: list[tuple[str, dict[str, Any], str]] = []

        async def send(text: str) -> str:
            self.sent.append(("send", {"text": text}, (request_meta() or {})[IDEMPOTENCY_META_KEY]))
            return f"sent {text}"

        async def look(text: str) -> str:
            self.sent.append(("look", {"text": text}, (request_meta() or {})[IDEMPOTENCY_META_KEY]))
            return f"saw {text}"

        tools = [
            StructuredTool.from_function(coroutine=send, name="send", description="acts"),
            StructuredTool.from_function(
                coroutine=look, name="look", description="reads", metadata={SAFE_TO_REPEAT: True},
            ),
        ]
        self.calls = [
            {"name": "send", "args": {"text": "a"}, "id": "call-a", "type": "tool_call"},
            {"name": "look", "args": {"text": "b"}, "id": "call-b", "type": "tool_call"},
            {"name": "send", "args": {"text": "c"}, "id": "call-c", "type": "tool_call"},
        ]
        model = _Scripted(messages=iter([AIMessage("", id="ai", tool_calls=self.calls), AIMessage("done")]))
        self.graph = build_graph(
            model=model, tools=lambda: tools, system_prompt=lambda: "", checkpointer=InMemorySaver(),
            ledger=ledger,
        )
        self.config: Any = {"configurable": {"thread_id": conversation}, "metadata": {"run_id": "run-2"}}

    def ref(self, call_id: str) -> CallRef:
        return CallRef(self.conversation, "ai", call_id)

    async def crash_left_uncertain(self, *call_ids: str) -> dict[str, str]:
        """Intents committed by a worker that died before their outcomes: their keys."""
        keys = {}
        for call in self.calls:
            if call["id"] in call_ids:
                entry = await self.ledger.begin(self.ref(call["id"]), "run-1", call["name"], call["args"])
                assert entry is not None
                keys[call["id"]] = entry.key
        return keys

    async def run(self, graph_input: Any) -> None:
        async for _ in self.graph.astream(graph_input, self.config, durability="sync"):
            pass

    async def state(self) -> Any:
        return await self.graph.aget_state(self.config)

    async def results(self) -> dict[str, ToolMessage]:
        messages = (await self.state()).values["messages"]
        return {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}


@pytest.fixture
async def turn(tmp_path: Path) -> Any:
    ledger, db, conversation = await ledger_on(tmp_path)
    yield Turn(ledger, conversation)
    await db.close()


async def test_an_uncertain_call_stops_for_a_person_while_a_safe_one_is_sent_again(turn: Turn) -> None:
    keys = await turn.crash_left_uncertain("call-a", "call-b")
    await turn.run({"messages": [HumanMessage("hi", id="h")]})

    # The safe call went again with its key, the new one went once; the uncertain one did not.
    new = await turn.ledger.entry(turn.ref("call-c"))
    assert new is not None
    assert sorted(turn.sent) == [("look", {"text": "b"}, keys["call-b"]), ("send", {"text": "c"}, new.key)]
    assert "call-a" not in {c for c in (await turn.results())}
    requests = interrupt_requests(await turn.state())
    assert requests == [{"id": "call-a", "name": "send", "arguments": {"text": "a"}, "kind": "uncertain",
                         "attempts": 1}]
    entry = await turn.ledger.entry(turn.ref("call-b"))
    assert entry is not None and (entry.state, entry.attempt) == (DONE, 2)


async def test_approve_sends_it_again_with_the_same_key(turn: Turn) -> None:
    keys = await turn.crash_left_uncertain("call-a")
    await turn.run({"messages": [HumanMessage("hi", id="h")]})
    decisions = [{"id": "call-a", "action": "approve"}]
    await turn.run(Command(resume=resume_value(await turn.state(), decisions)))

    again = [s for s in turn.sent if s[1] == {"text": "a"}]
    assert again == [("send", {"text": "a"}, keys["call-a"])]
    result = (await turn.results())["call-a"]
    assert result.content == "sent a" and result.response_metadata[UNCERTAIN_MARK]["action"] == "approve"
    assert (await turn.state()).values["messages"][-1].content == "done"
    entry = await turn.ledger.entry(turn.ref("call-a"))
    assert entry is not None and (entry.state, entry.attempt, entry.key) == (DONE, 2, keys["call-a"])


async def test_reject_never_sends_it_and_tells_the_model_it_may_have_run(turn: Turn) -> None:
    await turn.crash_left_uncertain("call-a")
    await turn.run({"messages": [HumanMessage("hi", id="h")]})
    decisions = [{"id": "call-a", "action": "reject", "message": "I will check by hand"}]
    await turn.run(Command(resume=resume_value(await turn.state(), decisions)))

    assert all(s[1] != {"text": "a"} for s in turn.sent)
    result = (await turn.results())["call-a"]
    assert result.status == "error" and "may or may not have taken effect" in str(result.content)
    assert "I will check by hand" in str(result.content)
    entry = await turn.ledger.entry(turn.ref("call-a"))
    assert entry is not None and (entry.state, entry.attempt) == (DONE, 1)  # never sent again
    # A later attempt (another resume) answers from the ledger: still not sent.
    assert (await turn.state()).values["messages"][-1].content == "done"


async def test_edit_sends_the_new_arguments_under_a_new_key(turn: Turn) -> None:
    keys = await turn.crash_left_uncertain("call-a")
    await turn.run({"messages": [HumanMessage("hi", id="h")]})
    decisions = [{"id": "call-a", "action": "edit", "arguments": {"text": "A"}}]
    await turn.run(Command(resume=resume_value(await turn.state(), decisions)))

    edited = [s for s in turn.sent if s[1] == {"text": "A"}]
    assert len(edited) == 1 and edited[0][2] != keys["call-a"]
    result = (await turn.results())["call-a"]
    assert result.content == "sent A"
    assert result.response_metadata[UNCERTAIN_MARK] == {
        "action": "edit", "attempts": 1, "proposed": {"text": "a"},
    }


async def test_several_uncertain_calls_are_listed_together_and_decided_each_on_its_own(turn: Turn) -> None:
    keys = await turn.crash_left_uncertain("call-a", "call-c")
    await turn.run({"messages": [HumanMessage("hi", id="h")]})
    requests = interrupt_requests(await turn.state()) or []
    assert sorted(r["id"] for r in requests) == ["call-a", "call-c"]
    assert {r["kind"] for r in requests} == {"uncertain"}

    decisions = [{"id": "call-a", "action": "reject"}, {"id": "call-c", "action": "approve"}]
    await turn.run(Command(resume=resume_value(await turn.state(), decisions)))
    sends = [s for s in turn.sent if s[0] == "send"]
    assert sends == [("send", {"text": "c"}, keys["call-c"])]
    results = await turn.results()
    assert results["call-a"].status == "error" and results["call-c"].content == "sent c"
    assert interrupt_requests(await turn.state()) is None


class Unanswered(Turn):
    """A turn whose calls are sent and get no answer (as a timeout or a lost transport leaves
    them: worker/tools/mcp.py tells the ledger, then raises the error the model would get)."""

    def __init__(self, ledger: Ledger, conversation: str, *, answered_after: int) -> None:
        super().__init__(ledger, conversation)
        self.answered_after = answered_after
        sent = self.sent

        async def silent(name: str, text: str) -> str:
            sent.append((name, {"text": text}, (request_meta() or {})[IDEMPOTENCY_META_KEY]))
            if len([s for s in sent if s[1] == {"text": text}]) <= self.answered_after:
                unanswered(f"tool {name} did not answer within 1s")
                raise ToolException(f"tool {name} did not answer within 1s")
            return f"{name} {text}"

        async def send(text: str) -> str:
            return await silent("send", text)

        async def look(text: str) -> str:
            return await silent("look", text)

        tools = [
            StructuredTool.from_function(coroutine=send, name="send", description="acts"),
            StructuredTool.from_function(
                coroutine=look, name="look", description="reads", metadata={SAFE_TO_REPEAT: True},
            ),
        ]
        self.calls = self.calls[:2]
        model = _Scripted(messages=iter([AIMessage("", id="ai", tool_calls=self.calls), AIMessage("done")]))
        self.graph = build_graph(
            model=model, tools=lambda: tools, system_prompt=lambda: "", checkpointer=InMemorySaver(),
            ledger=ledger,
        )


async def test_a_call_that_got_no_answer_is_asked_about_and_a_safe_one_sent_again_with_its_key(
    turn: Turn,
) -> None:
    unanswered_turn = Unanswered(turn.ledger, turn.conversation, answered_after=1)
    await unanswered_turn.run({"messages": [HumanMessage("hi", id="h")]})

    # Never a plain error for the model: the call that acts is put to a person, in this run ...
    assert interrupt_requests(await unanswered_turn.state()) == [
        {"id": "call-a", "name": "send", "arguments": {"text": "a"}, "kind": "uncertain", "attempts": 1}
    ]
    results = await unanswered_turn.results()
    assert "call-a" not in results
    # ... the safe one was sent again at once, with the same key, and answered.
    looks = [s for s in unanswered_turn.sent if s[0] == "look"]
    assert len(looks) == 2 and looks[0][2] == looks[1][2] and results["call-b"].content == "look b"
    a = await turn.ledger.entry(turn.ref("call-a"))
    assert a is not None and (a.state, a.attempt) == ("intent", 1)

    decisions = [{"id": "call-a", "action": "approve"}]
    await unanswered_turn.run(Command(resume=resume_value(await unanswered_turn.state(), decisions)))
    sends = [s for s in unanswered_turn.sent if s[0] == "send"]
    assert len(sends) == 2 and sends[0][2] == sends[1][2] == a.key
    assert (await unanswered_turn.results())["call-a"].content == "send a"
    assert (await unanswered_turn.state()).values["messages"][-1].content == "done"


async def test_no_answer_again_after_the_decision_is_told_to_the_model_not_asked_twice(turn: Turn) -> None:
    silent = Unanswered(turn.ledger, turn.conversation, answered_after=5)
    await silent.run({"messages": [HumanMessage("hi", id="h")]})
    decisions = [{"id": "call-a", "action": "approve"}]
    await silent.run(Command(resume=resume_value(await silent.state(), decisions)))

    results = await silent.results()
    assert interrupt_requests(await silent.state()) is None
    told = results["call-a"]
    assert told.status == "error" and "may or may not have taken effect" in str(told.content)
    # The safe one: sent twice with its key, then its error is the outcome (repeating it is harmless).
    assert len([s for s in silent.sent if s[0] == "look"]) == 2 and results["call-b"].status == "error"
    a, b = [await turn.ledger.entry(turn.ref(c)) for c in ("call-a", "call-b")]
    assert a is not None and b is not None and (a.state, a.attempt, b.state, b.attempt) == (DONE, 2, DONE, 2)
