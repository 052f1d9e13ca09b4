"""What mcp.json and the tools themselves say about repeating a call that may have run and about
asking before one runs (worker/tools/policy.py), and how an uncertain call is put to a person on
the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp.types import Tool, ToolAnnotations

from sophos_cli.approve import request_line
from worker.tools.mcp import McpServer, McpToolbox
from worker.tools.policy import (
    ApprovalPolicy,
    McpConfigError,
    RepeatPolicy,
    load_approvals,
    load_repeat,
    needs_approval,
    safe_to_repeat,
)


def _config(tmp_path: Path, **servers: dict[str, object]) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {n: {"command": "x", **s} for n, s in servers.items()}}))
    return path


def test_safe_to_repeat_takes_every_form_and_names_a_bad_one(tmp_path: Path) -> None:
    policy = load_repeat(_config(
        tmp_path, all={"safeToRepeat": True}, none={"safeToRepeat": False},
        some={"safeToRepeat": ["get"]}, each={"safeToRepeat": {"get": True, "put": False}}, plain={},
    ))
    assert policy("all", "put", hinted=False) and not policy("none", "get", hinted=True)
    assert policy("some", "get", hinted=False) and not policy("some", "put", hinted=False)
    assert policy("some", "put", hinted=True)  # not named: the tool's own annotations decide
    assert policy("each", "get", hinted=False) and not policy("each", "put", hinted=True)
    assert policy("plain", "x", hinted=True) and not policy("plain", "x", hinted=False)
    with pytest.raises(McpConfigError, match="server 'bad': safeToRepeat must be"):
        load_repeat(_config(tmp_path, bad={"safeToRepeat": "yes"}))


@pytest.mark.parametrize(("annotations", "safe"), [
    (None, False),
    (ToolAnnotations(readOnlyHint=True), True),
    (ToolAnnotations(idempotentHint=True), True),
    (ToolAnnotations(destructiveHint=True, idempotentHint=False), False),
])
def test_a_listed_tool_is_safe_to_repeat_when_its_annotations_say_so(
    annotations: ToolAnnotations | None, safe: bool
) -> None:
    server = McpServer("srv", {}, start_timeout=1, call_timeout=1)
    listed = Tool(name="t", description="d", inputSchema={"type": "object"}, annotations=annotations)
    assert safe_to_repeat(server._wrap(listed)) is safe
    overridden = McpServer("srv", {}, start_timeout=1, call_timeout=1, repeat=RepeatPolicy({"srv": False}))
    assert safe_to_repeat(overridden._wrap(listed)) is False


def test_the_cli_says_an_uncertain_call_may_already_have_run() -> None:
    request = {"id": "c1", "name": "tools__slow", "arguments": {"seconds": 3}}
    assert request_line({**request, "kind": "approval"}).startswith("approval needed: tools__slow(")
    line = request_line({**request, "kind": "uncertain", "attempts": 1})
    assert line.startswith("this call may already have run: tools__slow(") and "same key" in line


def test_sophos_show_says_what_a_resume_will_do_with_each_call() -> None:
    from sophos_cli.commands import plan_lines

    plan = [
        {"id": "c1", "name": "tools__echo", "action": "answer"},
        {"id": "c2", "name": "tools__slow", "action": "ask"},
        {"id": "c3", "name": "tools__look", "action": "resend"},
    ]
    assert plan_lines(plan) == [
        "  on resume tools__echo id c1: answered from the ledger (it finished; not sent again)",
        "  on resume tools__slow id c2: asked about first (it may already have run)",
        "  on resume tools__look id c3: sent again with its key (it may have run; safe to repeat)",
    ]


def test_require_approval_takes_every_form_and_defaults_to_what_the_tool_says(tmp_path: Path) -> None:
    policy = load_approvals(_config(
        tmp_path, all={"requireApproval": True}, none={"requireApproval": False},
        some={"requireApproval": ["put"]}, each={"requireApproval": {"put": True, "drop": False}}, plain={},
    ))
    asks = {(server, tool, hint): policy.for_tool(server, tool, destructive=hint) for server, tool, hint in [
        ("all", "get", False), ("none", "drop", True), ("some", "put", False), ("some", "get", False),
        ("some", "drop", True), ("each", "put", False), ("each", "drop", True), ("plain", "drop", True),
        ("plain", "x", False),
    ]}
    assert asks == {
        ("all", "get", False): True,
        ("none", "drop", True): False,  # configured: the hint is overruled
        ("some", "put", False): True, ("some", "get", False): False,
        ("some", "drop", True): True,  # not named: the tool's hints decide
        ("each", "put", False): True, ("each", "drop", True): False,
        ("plain", "drop", True): True, ("plain", "x", False): False,
    }
    assert policy("some__put") and not policy("plain__x") and not policy("nameless")
    with pytest.raises(McpConfigError, match="server 'bad': requireApproval must be"):
        load_approvals(_config(tmp_path, bad={"requireApproval": "yes"}))


@pytest.mark.parametrize(("annotations", "asks"), [
    (None, False),  # says nothing: MCP's default ("destructive") is not taken
    (ToolAnnotations(destructiveHint=True), True),
    (ToolAnnotations(destructiveHint=True, readOnlyHint=True), False),
    (ToolAnnotations(destructiveHint=False), False),
    (ToolAnnotations(readOnlyHint=True), False),
])
def test_a_tool_that_says_it_is_destructive_asks_unless_configured_otherwise(
    annotations: ToolAnnotations | None, asks: bool
) -> None:
    listed = Tool(name="t", description="d", inputSchema={"type": "object"}, annotations=annotations)
    server = McpServer("srv", {}, start_timeout=1, call_timeout=1)
    server.tools = (server._wrap(listed),)
    toolbox = McpToolbox([server])
    assert needs_approval(server.tools[0]) is asks and toolbox.needs_approval("srv__t") is asks
    quiet = McpServer("srv", {}, start_timeout=1, call_timeout=1, approvals=ApprovalPolicy({"srv": False}))
    assert needs_approval(quiet._wrap(listed)) is False
    # A tool not offered now (its server down): as configured, by name.
    assert McpToolbox([], ApprovalPolicy({}, {"srv__t": True})).needs_approval("srv__t") is True


def test_the_shipped_configuration_asks_before_the_fetch_tool_sends_anything_out() -> None:
    """docs/security.md: memory plus fetch is a way out for private data; a person sees each URL."""
    shipped = Path(__file__).resolve().parents[2] / "config" / "mcp.json"
    policy = load_approvals(shipped)
    assert policy("fetch__fetch") is True
    assert not policy("memory__read_graph")
