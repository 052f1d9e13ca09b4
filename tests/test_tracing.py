"""Traces (shared/tracing.py): what the API and the worker export over OTLP, received on loopback.

One worker and one API for the module, started with ``OTEL_EXPORTER_OTLP_ENDPOINT`` naming a
receiver the test runs (tests/support/otlp.py: the protobuf the SDK's exporter sends, decoded
with opentelemetry-proto) and a short ``OTEL_BSP_SCHEDULE_DELAY``. Each test reads the tree of
one run: with a tool call; killed mid-run (-9) and resumed; cancelled. A run whose worker is
killed on PostgreSQL, ended by the other worker when its lease lapses, has a stack of its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fakes.ollama import FakeOllama, Hang, Text, ToolCalls
from tests.support import stacks
from tests.support.browser import launch
from tests.support.client import chat, get_json, read_sse, tool_calls, wait_for
from tests.support.env import make_sophos_env
from tests.support.http import http_client
from tests.support.otlp import OtlpReceiver, Span
from tests.support.ports import free_port
from tests.support.procs import ProcessGroup
from tests.support.redis_server import RedisServer
from tests.support.waterfall import page as waterfall

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Stack(stacks.Stack):
    """The module's worker and API, and the receiver of their spans."""

    otlp: OtlpReceiver


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer, fake_ollama: FakeOllama
) -> Iterator[Stack]:
    with OtlpReceiver() as otlp, stacks.module_stack(
        tmp_path_factory.mktemp("tracing"), redis_server.url, fake_ollama, approval=["echo"],
        OTEL_EXPORTER_OTLP_ENDPOINT=otlp.url, OTEL_BSP_SCHEDULE_DELAY="50",
    ) as started:
        yield Stack(started.env, started.group, started.worker, otlp)


def one(spans: list[Span], name: str, **attributes: object) -> Span:
    found = [s for s in spans if s.name == name and attributes.items() <= s.attributes.items()]
    seen = [(s.name, s.attributes) for s in spans]
    assert len(found) == 1, f"{len(found)} spans {name} {attributes}: {seen}"[:3000]
    return found[0]


def children(spans: list[Span], parent: Span | str, name: str | None = None) -> list[Span]:
    parent_id = parent if isinstance(parent, str) else parent.span_id
    return sorted((s for s in spans if s.parent_id == parent_id and (name is None or s.name == name)),
                  key=lambda s: s.start_ns)


def run_trace(
    otlp: OtlpReceiver, run: str, ready: Callable[[list[Span]], bool] = lambda _: True, *, done: bool = True
) -> list[Span]:
    """The trace of ``run`` once its run span arrived (``done``; else its queue wait) and ``ready(trace)``."""
    marker = "run" if done else "queue wait"

    def found(spans: list[Span]) -> list[Span] | None:
        mine = [s for s in spans if s.name == marker and s.attributes.get("sophos.run.id") == run]
        trace = [s for s in spans if s.trace_id == mine[0].trace_id] if mine else []
        return trace if trace and ready(trace) else None

    spans: list[Span] = otlp.wait(found, message=f"the trace of run {run} ({marker} span)")
    return spans


def named(name: str, count: int = 1) -> Callable[[list[Span]], bool]:
    return lambda spans: sum(s.name == name for s in spans) >= count


def picture(spans: list[Span], title: str, path: Path) -> None:
    """The trace drawn as a waterfall (tests/support/waterfall.py) in Chromium, every span a row,
    saved to ``path`` and, with ``SOPHOS_SCREENSHOTS=DIR``, to DIR (docs/screenshots/trace.png)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 300})
            page.set_content(waterfall(spans, title))
            assert page.locator(".row").count() == len(spans)
            assert page.locator(".row .name").first.inner_text() == "POST /api/chat"
            page.screenshot(path=str(path), full_page=True)
            if folder := os.environ.get("SOPHOS_SCREENSHOTS"):
                page.screenshot(path=str(Path(folder) / path.name), full_page=True)
        finally:
            browser.close()


def test_a_run_with_a_tool_call_is_one_trace_from_the_request_to_its_end(
    stack: Stack, model: FakeOllama, tmp_path: Path
) -> None:
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), Text("Five."))
    conversation, run = chat(stack.api, "add 2 and 3")
    assert read_sse(stack.api, conversation)[-1].data["status"] == "completed"
    whole = named("chat test-model", 2)
    spans = run_trace(stack.otlp, run, lambda t: whole(t) and named("POST /api/chat")(t))

    request = one(spans, "POST /api/chat")
    assert (request.service, request.kind, request.parent_id) == ("sophos-api", "server", None)
    enqueue = one(spans, "enqueue run")
    assert enqueue.parent_id == request.span_id and enqueue.kind == "producer"
    assert enqueue.attributes["sophos.conversation.id"] == conversation
    wait = one(spans, "queue wait")
    job = one(spans, "run")
    assert wait.parent_id == job.parent_id == enqueue.span_id
    assert (wait.service, job.service, job.kind) == ("sophos-worker", "sophos-worker", "consumer")
    assert wait.start_ns < wait.end_ns <= job.start_ns + 5_000_000  # the wait ends as the run starts
    assert job.attributes["sophos.run.status"] == "completed" and job.attributes["sophos.run.kind"] == "run"
    assert job.end_ns >= max(s.end_ns for s in spans if s.service == "sophos-worker" and s is not job)

    steps = children(spans, job)
    assert [s.name for s in steps if s.name.startswith("step")] == ["step agent", "step tools", "step agent"]
    assert [s.attributes["langgraph.step"] for s in steps if s.name.startswith("step")] == [1, 2, 3]
    for step in (s for s in steps if s.name == "step agent"):
        [call] = children(spans, step)
        assert call.name == "chat test-model" and call.kind == "client"
        assert call.attributes["gen_ai.system"] == "ollama"
        assert call.attributes["gen_ai.operation.name"] == "chat"
        assert call.attributes["gen_ai.request.model"] == "test-model"
        assert call.attributes["gen_ai.usage.input_tokens"] > 0
        assert call.attributes["gen_ai.usage.output_tokens"] > 0
        assert 0 < call.attributes["gen_ai.server.time_to_first_token"] < call.seconds
        assert "gen_ai.first_token" in call.events
    [tool] = children(spans, one(spans, "step tools"))
    assert tool.name == "execute_tool tools__add"
    assert tool.attributes["gen_ai.tool.name"] == "tools__add"
    assert tool.attributes["sophos.tool.server"] == "tools"
    assert (tool.attributes["sophos.tool.ledger"], tool.attributes["sophos.tool.attempt"]) == ("sent", 1)
    [logged] = tool_calls(stack.env.tools_log, "add")[-1:]
    assert tool.attributes["sophos.tool.transport"] == "stdio"
    # Not the key the server got (a trace goes to whoever runs the collector): in no attribute.
    assert logged["key"] not in str(dict(tool.attributes))
    writes = [s for s in steps if s.name == "checkpoint write"]
    kinds = {s.attributes["sophos.checkpoint.kind"] for s in writes}
    assert kinds == {"checkpoint", "writes"} and len(writes) >= 4  # input + a checkpoint per step
    assert all(s.status != 2 for s in spans)

    # The worker's logs of this run carry its trace and the span current when they were written.
    logs = stack.worker.log_records()
    for event in ("run.started", "run.finished"):
        line = next(r for r in logs if r.get("event") == event and r["run_id"] == run)
        assert (line["trace_id"], line["span_id"]) == (job.trace_id, job.span_id), event
    assert all("trace_id" not in r for r in logs if r.get("event") == "worker.ready")  # no span then
    api_logs = next(p for p in stack.group.processes if p.module == "api").log_records()
    accepted = next(r for r in api_logs if r.get("event") == "run.accepted" and r.get("run_id") == run)
    assert (accepted["trace_id"], accepted["span_id"]) == (request.trace_id, request.span_id)

    # The picture in the manual (docs/operating.md, "Traces"): this trace, drawn.
    picture(spans, "One run's trace: POST /api/chat, a tool call, the answer", tmp_path / "trace.png")


def test_a_run_killed_mid_tool_ends_in_its_own_trace_and_its_resume_links_to_it(
    stack: Stack, model: FakeOllama
) -> None:
    model.script(ToolCalls([("tools__slow", {"seconds": 3})]), Text("All done."))
    conversation, run = chat(stack.api, "do the slow thing")
    wait_for(lambda: len(tool_calls(stack.env.tools_log, "slow")) == 1, timeout=20)
    # What ended before the kill was exported within OTEL_BSP_SCHEDULE_DELAY; the run's own
    # span, still open, dies with the process (a SIGKILL loses what is buffered).
    first = run_trace(stack.otlp, run, named("step agent"), done=False)
    stack.worker.kill()
    assert stack.worker.wait(10) == -signal.SIGKILL
    stack.worker = stack.group.start_worker(stack.env)
    assert wait_for(lambda: get_json(stack.api, f"/api/runs/{run}")["status"] == "interrupted", timeout=20)

    run_span_id = one(first, "step agent").parent_id
    assert run_span_id is not None and run_span_id not in {s.span_id for s in first}  # never exported
    recovered = stack.otlp.wait(
        lambda spans: [s for s in spans if s.name == "recover run" and s.attributes["sophos.run.id"] == run],
        message="the recovery's span",
    )[0]
    # Its ending is in the run's trace, beside the run (the job's context is the enqueue's).
    enqueue_id = one(first, "queue wait").parent_id
    assert (recovered.trace_id, recovered.parent_id) == (first[0].trace_id, enqueue_id)
    assert recovered.attributes["sophos.run.status"] == "interrupted"
    assert recovered.attributes["sophos.recovery"] == "worker_restarted"

    _, resumed = chat(stack.api, conversation=conversation, resume=True)
    assert read_sse(stack.api, conversation)[-1].data == {
        "conversation": conversation, "run": resumed, "status": "completed",
    }
    spans = run_trace(stack.otlp, resumed)
    job = one(spans, "run", **{"sophos.run.kind": "resume"})
    assert job.trace_id != recovered.trace_id  # its own request, its own trace...
    assert (recovered.trace_id, run_span_id) in job.links  # ...linked to the run it continues
    [tool] = [s for s in spans if s.name == "execute_tool tools__slow"]
    # The call in flight was sent again, with its key (the fake's tools are read-only).
    assert tool.attributes["sophos.tool.ledger"] == "sent_again_safe"
    assert tool.attributes["sophos.tool.attempt"] == 2
    assert tool_calls(stack.env.tools_log, "slow")[0]["key"] not in str(dict(tool.attributes))


def test_a_run_taken_over_on_postgresql_ends_in_its_own_trace(
    tmp_path: Path, start_redis: Callable[..., RedisServer], postgres_url: str, model: FakeOllama,
    procs: ProcessGroup,
) -> None:
    """Two workers on PostgreSQL with a 3 s lease (as tests/test_postgres.py): the one running the
    run is killed (-9), and the other ends the run when its lease lapses (worker/run/lifetime/leases.py), with
    the ``recover run`` span of start-up recovery, in the run's trace."""
    redis = start_redis(appendonly=False)  # not the module's: its worker would take these jobs
    with OtlpReceiver() as otlp:
        env = make_sophos_env(
            tmp_path, redis_url=redis.url, ollama_url=model.url, api_port=free_port(),
            DATABASE_URL=postgres_url, RUN_LEASE_SECONDS="3",
            OTEL_EXPORTER_OTLP_ENDPOINT=otlp.url, OTEL_BSP_SCHEDULE_DELAY="50",
        )
        hang = Hang(text="working ")
        model.script(hang)
        doomed = procs.start_worker(env)
        api = procs.start_api(env).url or ""
        conversation, run = chat(api, "doomed run")
        hang.wait_started(20)
        first = run_trace(otlp, run, done=False)  # its queue wait ended as the doomed worker took it
        survivor = procs.start_worker(env)
        doomed.kill()
        assert doomed.wait(10) == -signal.SIGKILL

        def ended(spans: list[Span]) -> list[Span]:
            return [s for s in spans if s.name == "recover run" and s.attributes.get("sophos.run.id") == run]

        # Within the lease (3 s), a pass of the survivor's leases and the export.
        recovered = otlp.wait(ended, timeout=30, message="the take-over's span")[0]
        enqueue_id = one(first, "queue wait").parent_id
        assert (recovered.trace_id, recovered.parent_id) == (first[0].trace_id, enqueue_id)
        assert recovered.service == "sophos-worker"
        assert recovered.attributes["sophos.recovery"] == "lease_lapsed"
        assert recovered.attributes["sophos.run.status"] == "interrupted"
        assert get_json(api, f"/api/runs/{run}")["status"] == "interrupted"
        assert read_sse(api, conversation)[-1].data["code"] == "INTERRUPTED"
        taken_over = [r for r in survivor.log_records() if r.get("event") == "run.interrupted_by_crash"]
        assert [r["run_id"] for r in taken_over] == [run]  # by the survivor, not at a start-up


def test_a_decision_links_to_the_run_that_waited_for_it(stack: Stack, model: FakeOllama) -> None:
    model.script(ToolCalls([("tools__echo", {"text": "hi"})]), Text("Echoed."))
    conversation, waited = chat(stack.api, "echo hi")
    assert read_sse(stack.api, conversation)[-1].data["status"] == "waiting"
    first = run_trace(stack.otlp, waited)
    asked = one(first, "step approval")
    assert asked.attributes["sophos.stopped"] == "GraphInterrupt" and asked.status != 2  # no failure
    assert one(first, "run").attributes["sophos.run.status"] == "waiting"
    [request] = get_json(stack.api, f"/api/conversations/{conversation}")["pendingApproval"]
    with http_client(base_url=stack.api, timeout=10) as http:
        decided = http.post("/api/chat", json={
            "conversation": conversation, "decisions": [{"id": request["id"], "action": "approve"}],
        })
    assert decided.status_code == 202, decided.text
    assert read_sse(stack.api, conversation)[-1].data["status"] == "completed"
    spans = run_trace(stack.otlp, decided.json()["run"])
    job = one(spans, "run", **{"sophos.run.kind": "decide"})
    waiting = one(first, "run")
    assert (waiting.trace_id, waiting.span_id) in job.links
    [tool] = [s for s in spans if s.name == "execute_tool tools__echo"]
    assert tool.attributes["sophos.tool.ledger"] == "sent"


def test_a_cancelled_run_shows_where_it_was_cut(stack: Stack, model: FakeOllama) -> None:
    hang = Hang(text="thinking")
    model.script(hang)
    caller = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")  # a client's own trace
    with http_client(base_url=stack.api, timeout=10) as http:
        accepted = http.post("/api/chat", json={"message": "think for ever"},
                             headers={"traceparent": f"00-{caller[0]}-{caller[1]}-01"})
        assert accepted.status_code == 202, accepted.text
        conversation, run = accepted.json()["conversation"], accepted.json()["run"]
        hang.wait_started(20)
        assert http.post(f"/api/runs/{run}/cancel").status_code == 202
    assert read_sse(stack.api, conversation)[-1].data["status"] == "cancelled"
    hang.release()
    spans = run_trace(stack.otlp, run, named("POST /api/chat"))
    request = one(spans, "POST /api/chat")
    assert (request.trace_id, request.parent_id) == caller  # the run's trace continues the caller's
    job = one(spans, "run")
    assert job.attributes["sophos.run.status"] == "cancelled" and job.status != 2
    step = one(spans, "step agent")
    call = one(spans, "chat test-model")
    assert call.parent_id == step.span_id and step.parent_id == job.span_id
    assert step.attributes["sophos.stopped"] == call.attributes["sophos.stopped"] == "CancelledError"
    assert "gen_ai.usage.output_tokens" not in call.attributes  # it never answered
    # The cut is closed in the thread after the step (worker/run/lifetime/stopping.py): its writes traced.
    closing = [s for s in children(spans, job, "checkpoint write") if s.start_ns >= step.end_ns]
    assert closing, "the thread's closing write"


def test_spans_still_buffered_are_sent_when_a_process_stops(stack: Stack, model: FakeOllama) -> None:
    """An API that would send its batch only in ten minutes sends it when it is stopped (SIGTERM)."""
    api = stack.group.start_api(stack.env.with_(OTEL_BSP_SCHEDULE_DELAY=600_000))
    url = api.url or ""
    conversation, run = chat(url, "hello")
    assert read_sse(url, conversation)[-1].data["status"] == "completed"

    def enqueued(spans: list[Span]) -> list[Span]:
        return [s for s in spans if s.name == "enqueue run" and s.attributes["sophos.run.id"] == run]

    run_trace(stack.otlp, run)  # the worker's spans came; the API's are still buffered
    assert not enqueued(stack.otlp.snapshot())
    api.terminate()
    assert api.wait(20) in (0, -signal.SIGTERM)
    stack.otlp.wait(enqueued, message="the stopped API's spans")


#: What tracing loads when it is on: the SDK's export pipeline, the OTLP exporter, protobuf. (A
#: library may import ``opentelemetry.sdk.trace`` by itself when it is installed: langsmith,
#: under langchain-core, does at import; docs/operating.md says so.)
EXPORT_MODULES = (
    "opentelemetry.sdk.trace.export", "opentelemetry.exporter", "opentelemetry.proto", "google.protobuf",
)


def test_without_an_endpoint_nothing_of_the_export_is_loaded_or_run(tmp_path: Path) -> None:
    """The API's and the worker's modules, imported as their processes import them, and
    tracing set up as they set it up, with the OTLP variables unset."""
    code = f"""
import sys, threading
from shared.settings import Settings
from shared import tracing
from shared.logging import configure_logging
import api.app, api.__main__, worker.resources, worker.__main__
settings = Settings.from_env({{"OTEL_SERVICE_NAME": "x"}})
configure_logging("json", trace_ids=settings.tracing)
assert tracing.setup(settings, "sophos-api") is False and not settings.tracing
with tracing.span("x") as span:
    span.set_attribute("a", 1)
assert tracing.checkpoint_hooks() == [] and tracing.traceparent() is None and not tracing.enabled()
loaded = sorted(m for m in sys.modules if m.startswith({EXPORT_MODULES!r}))
assert not loaded, loaded
assert [t.name for t in threading.enumerate()] == ["MainThread"]
print("clean")
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)})
    assert done.stdout.strip() == "clean", done.stderr
    # And with an endpoint, the settings ask for it (the SDK reads the rest itself).
    from shared.settings import Settings

    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert Settings.from_env(endpoint).tracing
    assert Settings.from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}).tracing
    assert not Settings.from_env({**endpoint, "OTEL_SDK_DISABLED": "true"}).tracing
    assert not Settings.from_env({**endpoint, "OTEL_TRACES_EXPORTER": "none"}).tracing
