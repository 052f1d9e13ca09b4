"""What an assistant and a run may say of the agent (shared/contracts/assistants.py): pure."""

from __future__ import annotations

import pytest

from shared.contracts.assistants import CONFIG_KEY, AgentConfig, agent_in, resolve, settings_of
from shared.contracts.codec import encode
from shared.errors import BadRequest


def test_the_context_wins_over_config_configurable_and_every_field_is_checked() -> None:
    said = settings_of({"configurable": {"model": "a", "system_prompt": "x"}}, {"model": "b"}, where="it")
    assert said == {"model": "b", "system_prompt": "x"}
    for config, context, named in (
        ({"recursion_limit": 3}, None, "config.recursion_limit"),
        (None, {"temperature": 1}, "'temperature'"),
        (None, {"system_prompt": 3}, "system_prompt"),
        (None, {"model": " "}, "model"),
        (None, {"tools": "tools__echo"}, "tools"),
        (None, {"require_approval": [""]}, "require_approval"),
        (None, {"configurable": ["require_approval"]}, "configurable"),
    ):
        with pytest.raises(BadRequest, match=named):
            settings_of(config, context, where="it")


def test_a_run_overrides_only_what_its_assistant_marks_configurable() -> None:
    stored = {"system_prompt": "Helper.", "tools": ["tools"], "require_approval": ["tools__add"]}
    agent = resolve("a-1", 3, stored, {"model": "other"})
    assert agent == AgentConfig("a-1", 3, "Helper.", "other", ("tools",), ("tools__add",))
    with pytest.raises(BadRequest, match="'tools'"):
        resolve("a-1", 3, stored, {"tools": []})
    with pytest.raises(BadRequest, match="override nothing"):
        resolve("a-1", 3, {**stored, "configurable": []}, {"model": "other"})
    assert resolve("a-1", 3, {"configurable": ["tools"]}, {"tools": ["x"]}).tools == ("x",)


def test_tools_are_named_by_server_or_one_by_one() -> None:
    agent = AgentConfig("a", 1, tools=("memory", "tools__echo"), require_approval=("tools__add",))
    assert agent.allows("memory__read_graph") and agent.allows("tools__echo")
    assert not agent.allows("tools__add") and not agent.allows("fetch__fetch")
    assert agent.requires("tools__add") and not agent.requires("tools__echo")
    assert AgentConfig("a", 1).allows("anything__at_all")


def test_a_runs_config_carries_its_agent_as_data() -> None:
    agent = AgentConfig("a", 2, "p", None, ("t",))
    assert agent_in({"configurable": {CONFIG_KEY: encode(agent)}}) == agent
    assert agent_in({"configurable": {"thread_id": "x"}}) is None and agent_in(None) is None
