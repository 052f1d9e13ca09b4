"""The shipped alert rules and dashboard (deploy/), checked against scrapes of real stacks.

Each alert of deploy/prometheus/alerts.yml is tested the way Prometheus would run it: a real
worker and API (real Redis, SQLite, fake model) are put in a healthy state and then in the
state the alert describes, ``/metrics`` is scraped in each, and ``promtool test rules`` runs
the rule file over those samples as series (each scrape held for some minutes of promtool's
simulated time, so ``for:`` is honoured without waiting for it). The alert must not fire on
the healthy scrapes, must still be pending just before its ``for:`` has passed, must fire
just after, and (where the state can end) must clear once it has. The dashboard's
expressions must parse, and every metric they name must be in a real scrape.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from redis.asyncio import Redis

from shared.contracts.jobs import JobKind, RunJob
from shared.redis.queue import submit_run
from tests.fakes.ollama import FakeOllama, Hang, Status, Text, ToolCalls
from tests.support.client import chat, get_json, read_sse, wait_for
from tests.support.env import SophosEnv, require_approval
from tests.support.faults import execute
from tests.support.http import http_client
from tests.support.metrics import Key, Scrape, scrape

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "sophos-dashboard.json"
PROMTOOL = shutil.which("promtool") or "promtool"  # .ci/run installs Debian's `prometheus`
#: labels Prometheus adds to every series it scrapes
TARGET = {"job": "sophos", "instance": "api:8000"}
#: minutes of simulated time each healthy scrape is held (longer than the rules' 10 min windows)
HOLD = 15


# --- reading ------------------------------------------------------------------------------


def scraped_when(api_url: str, sample: str | Key, value: float, timeout: float = 30.0) -> Scrape:
    """The first scrape in which ``sample`` (a name: the unlabelled sample) has ``value``."""
    key = (sample, ()) if isinstance(sample, str) else sample

    def matching() -> Scrape | None:
        scraped = scrape(api_url)
        return scraped if scraped.get(key) == value else None

    found = wait_for(matching, timeout=timeout, message=f"{key} == {value} in /metrics")
    assert found is not None
    return found


def alerting_rules() -> dict[str, dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def minutes(duration: str) -> int:
    """A rule's ``for:`` in whole minutes (``90s`` counts as 2)."""
    match = re.fullmatch(r"(\d+)([smh])", duration)
    assert match, f"unexpected duration {duration!r}"
    seconds = int(match[1]) * {"s": 1, "m": 60, "h": 3600}[match[2]]
    return math.ceil(seconds / 60)


# --- promtool --------------------------------------------------------------------------


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return repr(value)


def input_series(timeline: Sequence[tuple[Scrape, int]]) -> list[dict[str, str]]:
    """One promtool series per sample seen in any scrape: each scrape's value for its minutes,
    ``_`` (no sample) where a scrape did not have it."""
    keys = sorted({key for scraped, _ in timeline for key in scraped})
    series = []
    for name, labels in keys:
        matchers = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted({**TARGET, **dict(labels)}.items()))
        values = []
        for scraped, span in timeline:
            value = scraped.get((name, labels))
            values += [_number(value) if value is not None else "_"] * span
        series.append({"series": f"{name}{{{matchers}}}", "values": " ".join(values)})
    return series


def expected(rule: dict[str, Any]) -> dict[str, Any]:
    """The alert as promtool reports it when it fires: rule labels, the job, the annotations."""
    return {
        "exp_labels": {"job": TARGET["job"], **rule["labels"]},
        "exp_annotations": {k: str(v) for k, v in rule["annotations"].items()},
    }


@dataclass
class Story:
    """Scrapes of one stack, in the order they were taken."""

    #: healthy, before the state (counters grow from these)
    before: list[Scrape]
    #: in the state the alert describes
    state: Scrape
    #: healthy again once the cause is gone (None: the test does not end the state)
    after: Scrape | None = None


def unit_tests(alert: str, story: Story) -> dict[str, Any]:
    """promtool's unit-test file: healthy scrapes never fire; the state fires after ``for:``."""
    rule = alerting_rules()[alert]
    wait = minutes(rule.get("for", "0m"))
    healthy = [*story.before, *([story.after] if story.after is not None else [])]
    quiet_span = [(s, HOLD) for s in healthy[:-1]] + [(healthy[-1], wait + HOLD)]
    quiet_end = sum(span for _, span in quiet_span) - 1
    onset = HOLD * len(story.before)
    timeline = [(s, HOLD) for s in story.before] + [(story.state, wait + 5)]
    checks: list[dict[str, Any]] = [
        {"eval_time": f"{t}m", "alertname": alert, "exp_alerts": []}
        for t in sorted({HOLD - 1, quiet_end // 2, quiet_end})
    ]
    firing: list[dict[str, Any]] = [
        {"eval_time": f"{onset - 1}m", "alertname": alert, "exp_alerts": []},
        {"eval_time": f"{onset + max(wait - 1, 0)}m", "alertname": alert,
         "exp_alerts": [] if wait > 0 else [expected(rule)]},
        {"eval_time": f"{onset + wait + 1}m", "alertname": alert, "exp_alerts": [expected(rule)]},
    ]
    if story.after is not None:
        cleared = onset + wait + 5
        timeline.append((story.after, HOLD))
        firing.append({"eval_time": f"{cleared + 1}m", "alertname": alert, "exp_alerts": []})
    return {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {"interval": "1m", "input_series": input_series(quiet_span), "alert_rule_test": checks},
            {"interval": "1m", "input_series": input_series(timeline), "alert_rule_test": firing},
        ],
    }


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


def assert_alert_behaves(alert: str, story: Story, tmp_path: Path) -> None:
    path = tmp_path / f"{alert}.test.yml"
    path.write_text(yaml.safe_dump(unit_tests(alert, story), sort_keys=False, width=1 << 16))
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, f"promtool test rules {path}:\n{result.stdout}\n{result.stderr}"


# --- the rule file ----------------------------------------------------------------------


def test_promtool_checks_the_rules() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerting_rules())} rules found" in result.stdout


@pytest.mark.fast
def test_each_alert_waits_has_a_severity_and_tells_the_operator_what_to_do() -> None:
    rules = alerting_rules()
    assert set(rules) == {
        "SophosQueueBackingUp", "SophosNoLiveWorker", "SophosRunsFailing", "SophosApprovalsWaiting",
        "SophosOutcomesDeferred",
    }
    for name, rule in rules.items():
        assert minutes(rule["for"]) >= 1, name
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule["annotations"]["summary"] and len(rule["annotations"]["description"]) > 80, name
        assert "by (job)" in rule["expr"], f"{name}: keep the job label (several deployments)"


@pytest.mark.fast
def test_the_manual_lists_each_alert_as_the_file_has_it() -> None:
    manual = (ROOT / "docs" / "metrics.md").read_text()
    rows = {m[1]: m[2] for m in re.finditer(r"^\| `(Sophos\w+)` \| (.*) \|$", manual, re.M)}
    rules = alerting_rules()
    assert set(rows) == set(rules)
    for name, rule in rules.items():
        condition, wait, severity = [cell.strip() for cell in rows[name].rsplit(" | ", 2)]
        assert (wait, severity) == (rule["for"], rule["labels"]["severity"]), name
        shown = re.match(r"`([^`]+)`", condition)
        assert shown is None or shown[1] == rule["expr"], name


# --- each alert, on a real stack -------------------------------------------------------


async def test_queue_backing_up(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, redis: Redis, tmp_path: Path
) -> None:
    worker = start_worker(sophos_env)
    api = start_api(sophos_env).url
    conversation, _ = chat(api, "hello")
    assert read_sse(api, conversation)[-1].event == "end"
    idle = scrape(api)
    # Busy but moving: a run queued behind a running one, seconds old, is not a backlog.
    slow = Hang(text="thinking")
    model.script(slow)
    chat(api, "a slow one")
    slow.wait_started(20)
    _, behind = chat(api, "behind it")
    busy = scraped_when(api, "sophos_runs_queued", 1)
    slow.release()
    wait_for(
        lambda: get_json(api, f"/api/runs/{behind}")["status"] == "completed", message="the queue drained"
    )

    worker.kill()
    for i in range(3):
        chat(api, f"queued {i}")
    # And one accepted ten minutes ago: submitted as the API submits, its clock set back.
    old = RunJob(
        run_id=str(uuid.uuid4()), conversation_id=str(uuid.uuid4()), kind=JobKind.RUN,
        message="accepted ten minutes ago", enqueued_at=time.time() - 600, new_conversation=True,
    )
    assert await submit_run(redis, old, title="accepted ten minutes ago") is None
    backlog = scraped_when(api, "sophos_runs_queued", 4)
    assert 600 <= backlog[("sophos_queue_oldest_age_seconds", ())] < 700
    assert busy[("sophos_queue_oldest_age_seconds", ())] < 60
    assert_alert_behaves("SophosQueueBackingUp", Story(before=[idle, busy], state=backlog), tmp_path)


def test_no_live_worker(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, tmp_path: Path
) -> None:
    worker = start_worker(sophos_env)
    api = start_api(sophos_env).url
    conversation, _ = chat(api, "hello")
    assert read_sse(api, conversation)[-1].event == "end"
    alive = scraped_when(api, "sophos_worker_up", 1)
    worker.kill()  # SIGKILL: Redis drops its beating connection, nothing says goodbye
    gone = scraped_when(api, "sophos_worker_up", 0)
    assert gone[("sophos_workers", ())] == 0
    again = start_worker(sophos_env)
    back = scraped_when(api, "sophos_worker_up", 1)
    assert again.alive
    assert_alert_behaves("SophosNoLiveWorker", Story(before=[alive], state=gone, after=back), tmp_path)


def test_runs_failing(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, tmp_path: Path
) -> None:
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    finished = ("sophos_runs_finished_total", (("status", "completed"),))
    failed = ("sophos_runs_finished_total", (("status", "failed"),))
    before = []
    for i in range(2):
        conversation, _ = chat(api, f"fine {i}")
        assert read_sse(api, conversation)[-1].event == "end"
        before.append(scraped_when(api, finished, i + 1))
    # One failure among many is not the alert's business: three in a row are.
    model.script(Status(500, {"error": "model crashed"}), Status(500), Status(500))
    for i in range(3):
        conversation, _ = chat(api, f"fails {i}")
        assert read_sse(api, conversation)[-1].data["code"] == "MODEL_UNAVAILABLE"
    state = scraped_when(api, failed, 3)
    assert before[-1][failed] == 0
    assert_alert_behaves("SophosRunsFailing", Story(before=before, state=state), tmp_path)


def test_approvals_waiting(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, tmp_path: Path
) -> None:
    require_approval(sophos_env, ["add"])
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    conversation, _ = chat(api, "hello")
    assert read_sse(api, conversation)[-1].event == "end"
    before = scrape(api)
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), Text("The sum is 5."))
    chat(api, "add 2 and 3", conversation)
    assert read_sse(api, conversation)[-1].data["status"] == "waiting"
    waiting = scraped_when(api, "sophos_conversations_waiting", 1)
    [request] = get_json(api, f"/api/conversations/{conversation}")["pendingApproval"]
    with http_client(base_url=api, timeout=10) as http:
        decided = http.post("/api/chat", json={
            "conversation": conversation, "decisions": [{"id": request["id"], "action": "approve"}],
        })
    assert decided.status_code == 202, decided.text
    assert read_sse(api, conversation)[-1].data["status"] == "completed"
    after = scraped_when(api, "sophos_conversations_waiting", 0)
    assert_alert_behaves(
        "SophosApprovalsWaiting", Story(before=[before], state=waiting, after=after), tmp_path
    )


#: SQLite refuses to record any run's outcome (as a damaged file would) until the trigger is dropped
REFUSE_OUTCOMES = """
CREATE TRIGGER test_refuse_outcomes BEFORE UPDATE OF status ON runs WHEN NEW.status <> 'running'
BEGIN SELECT RAISE(ABORT, 'outcome refused by the test'); END
"""


def test_outcomes_deferred(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, tmp_path: Path
) -> None:
    worker = start_worker(sophos_env)
    api = start_api(sophos_env).url
    conversation, _ = chat(api, "hello")
    assert read_sse(api, conversation)[-1].event == "end"
    before = scraped_when(api, "sophos_outcomes_deferred", 0)
    execute(sophos_env.database_path, REFUSE_OUTCOMES)
    _, run = chat(api, "answered, not recorded", conversation)
    assert read_sse(api, conversation)[-1].event == "end"
    worker.wait_for_log("run.outcome_deferred")
    state = scraped_when(api, "sophos_outcomes_deferred", 1)
    execute(sophos_env.database_path, "DROP TRIGGER test_refuse_outcomes")
    after = scraped_when(api, "sophos_outcomes_deferred", 0)
    assert get_json(api, f"/api/runs/{run}")["status"] == "completed"
    assert_alert_behaves("SophosOutcomesDeferred", Story(before=[before], state=state, after=after), tmp_path)


# --- the dashboard ----------------------------------------------------------------------

#: PromQL words that are not metric names
KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
    "offset", "inf", "nan",
})


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (Grafana's ``$variables`` allowed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"(?<![\w:])\d+(\.\d+)?([eE][+-]?\d+)?", "", text)  # numbers
    words = re.finditer(r"(?<![\w:$])([a-zA-Z_:][\w:]*)\s*(\(?)", text)
    names = {m[1] for m in words if not m[2]}  # a word before "(" is a function
    return names - KEYWORDS


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for top in dashboard["panels"] for p in [top, *top.get("panels", [])]]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def dashboard_variables_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    found = set()
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        found.update(re.findall(r"label_values\(\s*([a-zA-Z_:][\w:]*)\s*,", text))
    return found


@pytest.mark.fast
def test_metric_names_are_read_from_promql() -> None:
    expr = (
        'histogram_quantile(0.95, max by (le, tool) (rate(sophos_tool_call_duration_seconds_bucket'
        '{job=~"$job",tool="a{b}"}[5m]))) / 1e9 > bool 0.5 and on (job) up'
    )
    assert metric_names(expr) == {"sophos_tool_call_duration_seconds_bucket", "up"}


@pytest.mark.fast
def test_the_dashboard_is_grafana_json_with_queries_on_every_panel() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    assert dashboard["__inputs"] == []  # imported as it is: its variables choose the source
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == ("datasource", "prometheus")
    assert variables["job"]["type"] == "query" and dashboard_variables_metrics() == {"sophos_worker_up"}
    shown = {name for expr in dashboard_queries() for name in metric_names(expr)}
    assert shown >= {  # what docs/metrics.md says it shows
        "sophos_runs_queued", "sophos_runs_running", "sophos_conversations_waiting",
        "sophos_queue_oldest_age_seconds", "sophos_workers", "sophos_worker_heartbeat_age_seconds",
        "sophos_outcomes_deferred", "sophos_runs_finished_total", "sophos_run_duration_seconds_bucket",
        "sophos_model_call_duration_seconds_bucket", "sophos_tool_call_duration_seconds_bucket",
        "sophos_sse_subscribers", "process_cpu_seconds_total", "process_resident_memory_bytes",
        "sophos_queue_wait_seconds_bucket", "sophos_time_to_first_token_seconds_bucket",
        "sophos_checkpoint_write_duration_seconds_bucket",
    }
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert all(t["expr"] and metric_names(t["expr"]) for t in panel["targets"]), panel["title"]


def test_the_dashboard_queries_parse(tmp_path: Path) -> None:
    """promtool parses each query, as a recording rule (Grafana's ``$job`` given a value)."""
    rules = [
        {"record": f"dashboard:query_{i}", "expr": expr.replace("$job", ".*")}
        for i, expr in enumerate(dashboard_queries())
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_metric_the_dashboard_shows_is_in_a_real_scrape(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 2})]), Text("Four."))
    conversation, _ = chat(api, "add two and two")
    assert read_sse(api, conversation)[-1].event == "end"
    tool_calls = ("sophos_tool_call_duration_seconds_count", (("tool", "tools__add"),))
    scraped = {name for name, _ in scraped_when(api, tool_calls, 1)}
    used = {name for expr in dashboard_queries() for name in metric_names(expr)}
    used |= dashboard_variables_metrics()
    assert used - scraped == set(), "the dashboard names metrics /metrics does not serve"
    # And the alerts: each names only metrics a scrape has.
    alerts = {name for rule in alerting_rules().values() for name in metric_names(rule["expr"])}
    assert alerts - scraped == set()
