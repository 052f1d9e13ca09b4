"""LOG_FORMAT=json: every line either process writes is one JSON object.

Our events, the standard library's records (uvicorn's, arq's, with their tracebacks) and
what MCP servers print on their stderr, through a full run with the real worker and API.
"""

from __future__ import annotations

import json
import socket
import time
import uuid

import redis as redis_sync

from shared.redis.keys import QUEUE_NAME, arq_job_key
from tests.fakes.ollama import FakeOllama, Text, ToolCalls
from tests.fakes.tools_server import STARTED_LINE
from tests.support.client import post_chat, read_sse
from tests.support.env import SophosEnv
from tests.support.procs import ServiceProcess


def assert_all_json(proc: ServiceProcess) -> list[dict[str, object]]:
    lines = proc.log_text().splitlines()
    assert lines, f"{proc.name} wrote nothing"
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError:
            raise AssertionError(f"{proc.name} line {number} is not JSON: {line!r}") from None
        assert isinstance(record, dict) and {"event", "level", "timestamp"} <= set(record), line
        records.append(record)
    return records


def test_every_line_of_a_full_run_is_json(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    assert sophos_env["LOG_FORMAT"] == "json"
    worker = start_worker(sophos_env)
    api = start_api(sophos_env)

    # A run with a tool call: the model, the tool server, the checkpoints, the events.
    model.script(ToolCalls([("tools__echo", {"text": "hi"})]), Text("It said hi."))
    posted = post_chat(api.url, "echo hi")
    assert posted.status_code == 202, posted.text
    events = read_sse(api.url, posted.json()["conversation"])
    assert events[-1].event == "end" and events.text == "It said hi."

    # The tool server's own stderr line, as an event of the worker's.
    started = json.loads(worker.wait_for_log(STARTED_LINE))
    assert (
        started["event"] == "mcp.stderr" and started["server"] == "tools" and started["line"] == STARTED_LINE
    )
    assert "run_id" not in started  # a server's line belongs to no run

    # A library's record in each process. uvicorn: a request it cannot parse.
    host, port = api.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        conn.recv(4096)
    uvicorn = json.loads(api.wait_for_log("Invalid HTTP request received"))
    assert uvicorn["logger"].startswith("uvicorn") and uvicorn["level"] == "warning"
    # arq: a job it cannot decode, logged with its traceback.
    job_id = f"undecodable-{uuid.uuid4().hex}"
    client = redis_sync.Redis.from_url(sophos_env.redis_url)
    try:
        client.set(arq_job_key(job_id), b"\x80 not a job", ex=600)
        client.zadd(QUEUE_NAME, {job_id: int(time.time() * 1000)})
        arq = json.loads(worker.wait_for_log(f"deserializing job {job_id} failed", timeout=20))
    finally:
        client.close()
    assert arq["logger"].startswith("arq") and arq["level"] == "error" and "Traceback" in arq["exception"]

    # Shutdown included (uvicorn ends by raising the SIGTERM it caught again: no exit code check).
    worker.stop()
    api.stop()
    worker_records = assert_all_json(worker)
    api_records = assert_all_json(api)
    assert any(r["event"] == "worker.stopped" for r in worker_records)
    assert any(r["event"] == "request" for r in api_records)
