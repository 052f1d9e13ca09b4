"""The deployment files: docker-compose.yml, deploy/*.yml, the Dockerfile, deploy/nginx.conf, .env.example.

No Docker engine is needed. The compose file is read with a YAML parser and checked
against what the manual (docs/deployment.md) promises (services, health checks, volumes and who writes them,
the mounted config, the token from ``.env``), and validated by a compose CLI where one is
installed (``apt-get install docker-compose`` validates without an engine). The nginx
settings run in a real nginx where one is installed (Debian's ``nginx-light``), in front
of a real API process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest
import yaml

from tests.support.client import wait_for
from tests.support.env import SophosEnv
from tests.support.http import http_client
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parent.parent
COMPOSE = REPO / "docker-compose.yml"
GPU_OVERRIDE = REPO / "deploy" / "gpu.yml"
POSTGRES_OVERRIDE = REPO / "deploy" / "postgres.yml"
DOCKERFILE = REPO / "Dockerfile"
NGINX_CONF = REPO / "deploy" / "nginx.conf"
ENV_EXAMPLE = REPO / ".env.example"
MCP_CONFIG = REPO / "config" / "mcp.json"

MEMORY_PACKAGE = "@modelcontextprotocol/server-memory"
DATA_VOLUME = "sophos-data"
POSTGRES_PROFILE = "postgres"
DEFAULT_SERVICES = {"redis", "ollama", "worker", "api", "proxy"}


def compose(path: Path = COMPOSE) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text())
    assert isinstance(loaded, dict)
    return loaded


def active(services: dict[str, Any], profiles: tuple[str, ...] = ()) -> set[str]:
    """The services ``up`` starts with these profiles (the compose spec: no profile, or one enabled)."""
    return {
        name
        for name, service in services.items()
        if not service.get("profiles") or set(service["profiles"]) & set(profiles)
    }


def depends_on(service: dict[str, Any]) -> dict[str, Any]:
    """A service's depends_on as a mapping (the list form means service_started)."""
    found = service.get("depends_on", {})
    if isinstance(found, list):
        return {name: {"condition": "service_started"} for name in found}
    assert isinstance(found, dict)
    return found


def mounts(service: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(source, target, read_only) of a service's volumes, short or long syntax."""
    found = []
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target, *mode = volume.split(":")
            found.append((source, target, bool(mode) and "ro" in mode[0].split(",")))
        else:
            found.append((volume["source"], volume["target"], bool(volume.get("read_only"))))
    return found


def dockerfile_env() -> dict[str, str]:
    """The image's ENV (``ENV A=1 \\ B=2`` form)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            env.update(item.partition("=")[::2] for item in line[4:].split())
    return env


# --- the compose file ------------------------------------------------------------------------


def test_compose_file_parses_with_its_services_and_volumes() -> None:
    spec = compose()
    services = spec["services"]
    assert set(services) == DEFAULT_SERVICES | {"postgres"}
    assert active(services) == DEFAULT_SERVICES  # postgres only under its profile (below)
    assert set(spec["volumes"]) == {
        "redis-data", "ollama-models", DATA_VOLUME, "sophos-store", "postgres-data",
    }
    # Redis keeps accepted runs across a restart (AOF), DESIGN's requirement.
    assert "--appendonly" in services["redis"]["command"]
    # Every service runs for good: each has a health check and comes back after a crash.
    for name, service in services.items():
        check = service.get("healthcheck")
        assert check and check["test"][0] in ("CMD", "CMD-SHELL"), f"{name} has no health check"
        assert service.get("restart") == "unless-stopped", name
    assert services["ollama"]["healthcheck"]["test"] == ["CMD", "ollama", "list"]
    assert services["worker"]["healthcheck"]["test"] == ["CMD", "python", "-m", "worker", "--check"]
    assert services["worker"]["depends_on"] == {
        "redis": {"condition": "service_healthy"},
        "ollama": {"condition": "service_healthy"},
    }
    for name in ("worker", "api"):
        assert services[name]["environment"]["LOG_FORMAT"] == "json", name
    # Only the proxy publishes a port.
    assert [name for name, service in services.items() if "ports" in service] == ["proxy"]


def test_only_the_worker_mounts_the_database_read_write() -> None:
    services = compose()["services"]
    database_dir = str(Path(dockerfile_env()["DATABASE_PATH"]).parents[1])  # /data/db/sophos.db -> /data
    writers, readers = [], []
    for name, service in services.items():
        for source, target, read_only in mounts(service):
            if source == DATA_VOLUME:
                assert target == database_dir, (name, target)
                (readers if read_only else writers).append(name)
    assert writers == ["worker"]
    # The API reads it (mode=ro) through a read-only mount: see the SQLite test below.
    assert readers == ["api"]


def test_config_is_mounted_not_baked_into_the_image() -> None:
    config_dir = dockerfile_env()["CONFIG_DIR"]
    worker = compose()["services"]["worker"]
    assert ("./config", config_dir, True) in mounts(worker)
    copied = [line for line in DOCKERFILE.read_text().splitlines() if line.startswith(("COPY", "ADD"))]
    assert copied and not [line for line in copied if "config" in line.split()[1:-1]], copied


def test_api_token_comes_from_env_and_other_commands_need_none(sophos_env: SophosEnv) -> None:
    api = compose()["services"]["api"]
    # ${VAR:?message} fails every compose command (pull, logs, exec) while unset: not used.
    assert ":?" not in COMPOSE.read_text()
    assert api["environment"]["API_TOKEN"] == "${API_TOKEN:-}"
    assert api["environment"]["API_HOST"] == "0.0.0.0"  # beyond loopback: a token is required
    example = dict(
        line.split("=", 1)
        for line in ENV_EXAMPLE.read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert set(example) >= {"API_TOKEN", "OLLAMA_MODEL", "CORS_ORIGINS"}
    assert example["API_TOKEN"] == ""  # a secret the deployer makes, never one we ship
    # The PostgreSQL variant is offered, commented out: the default deployment stays SQLite.
    offered = ENV_EXAMPLE.read_text()
    assert "# COMPOSE_FILE=docker-compose.yml:deploy/postgres.yml" in offered
    assert "# COMPOSE_PROFILES=postgres" in offered and "COMPOSE_FILE" not in example
    assert ".env" in (REPO / ".gitignore").read_text().split()
    # What compose passes when .env sets no token: the API refuses to start, naming it.
    env = sophos_env.with_(API_HOST=api["environment"]["API_HOST"], API_TOKEN="")
    done = subprocess.run(
        [sys.executable, "-m", "api"], env=env, capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.returncode == 2, done
    assert "API_TOKEN" in done.stderr and "refusing to start" in done.stderr


def test_the_image_runs_as_a_user_that_owns_the_data_dirs() -> None:
    lines = DOCKERFILE.read_text().splitlines()
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0", "0:0"), users
    user = users[-1].split(":")[0]
    text = DOCKERFILE.read_text()
    assert re.search(rf"useradd\b[^\n]*\b{user}\b", text)
    data_dir = str(Path(dockerfile_env()["DATABASE_PATH"]).parents[1])
    assert re.search(rf"chown -R {user}:{user} {data_dir}\b", text)
    for path in (dockerfile_env()["DATABASE_PATH"], dockerfile_env()["MEMORY_FILE_PATH"]):
        assert f"mkdir -p {Path(path).parent}" in text or Path(path).parent.as_posix() in text


def test_the_stores_items_are_on_a_volume_the_api_and_the_worker_both_write() -> None:
    """The Store's items (STORE_PATH) are written by every API process and the worker: their file is
    on a volume of its own, read-write for both, owned by the image's user; the database's volume
    stays read-only for the API."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    for name in ("worker", "api"):
        store = services[name]["environment"]["STORE_PATH"]
        mounts = [str(v) for v in services[name]["volumes"]]
        folder = str(Path(store).parent)
        assert any(m.split(":")[1] == folder and not m.endswith(":ro") for m in mounts), (name, mounts)
        assert not folder.startswith("/data"), store
    assert "sophos-data:/data:ro" in services["api"]["volumes"]
    assert re.search(r"chown -R sophos:sophos [^\n]*/store\b", DOCKERFILE.read_text())


def test_memory_server_is_pinned_to_one_exact_version() -> None:
    pinned = re.compile(re.escape(MEMORY_PACKAGE) + r"@(\d+\.\d+\.\d+)\b")
    args = json.loads(MCP_CONFIG.read_text())["mcpServers"]["memory"]["args"]
    local = [m.group(1) for arg in args if (m := pinned.fullmatch(arg))]
    image = pinned.findall(DOCKERFILE.read_text())
    assert len(local) == 1 and image == local, (args, image)
    # No unpinned mention left: npx would ask the registry for "latest" at every start.
    for text in (MCP_CONFIG.read_text(), DOCKERFILE.read_text()):
        assert text.count(MEMORY_PACKAGE) == len(pinned.findall(text))
    # In the image, npx resolves it from its cache, never from the registry.
    assert "offline=true" in DOCKERFILE.read_text()


def _compose_cli() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


@pytest.mark.skipif(_compose_cli() is None, reason="no compose CLI (apt-get install docker-compose)")
def test_compose_cli_accepts_the_files_without_a_token(tmp_path: Path) -> None:
    cli = _compose_cli()
    assert cli is not None
    env = {k: v for k, v in os.environ.items() if k not in ("API_TOKEN", "CORS_ORIGINS", "OLLAMA_MODEL")}
    # An empty env file stands in for a .env the deployer may not have written yet; the
    # PostgreSQL variant needs its password in it (and refuses without: below), no token.
    empty = tmp_path / "empty.env"
    empty.write_text("")
    with_password = tmp_path / "password.env"
    with_password.write_text("POSTGRES_PASSWORD=chosen-by-the-deployer\n")
    combinations = (
        [COMPOSE],
        [COMPOSE, GPU_OVERRIDE],
        [COMPOSE, POSTGRES_OVERRIDE],
        [COMPOSE, POSTGRES_OVERRIDE, GPU_OVERRIDE],
    )
    for files in combinations:
        env_file = with_password if POSTGRES_OVERRIDE in files else empty
        argv = [*cli, "--project-directory", str(REPO), "--env-file", str(env_file)]
        for path in files:
            argv += ["-f", str(path)]
        if POSTGRES_OVERRIDE in files:
            argv += ["--profile", POSTGRES_PROFILE]
        done = subprocess.run([*argv, "config"], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        merged = yaml.safe_load(done.stdout)
        assert merged["services"]["api"]["environment"]["API_TOKEN"] in ("", None)
        if GPU_OVERRIDE in files:
            devices = merged["services"]["ollama"]["deploy"]["resources"]["reservations"]["devices"]
            assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]


# --- PostgreSQL and several workers (deploy/postgres.yml, profile "postgres") ----------------

_POSTGRES_ENV = ("POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB", "COMPOSE_FILE", "COMPOSE_PROFILES")


def _merged(
    cli: list[str], files: list[Path], env_file: Path, profiles: tuple[str, ...] = ()
) -> dict[str, Any]:
    """What the compose CLI makes of these files: ``config``, parsed."""
    env = {k: v for k, v in os.environ.items() if k not in _POSTGRES_ENV}
    argv = [*cli, "--project-directory", str(REPO), "--env-file", str(env_file)]
    for path in files:
        argv += ["-f", str(path)]
    for profile in profiles:
        argv += ["--profile", profile]
    done = subprocess.run(
        [*argv, "config"], env=env, capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    loaded = yaml.safe_load(done.stdout)
    assert isinstance(loaded, dict)
    return loaded


def _postgres_url_checks(services: dict[str, Any], password: str) -> None:
    """The worker and the API get one DATABASE_URL, naming the postgres service and its database."""
    postgres_env = services["postgres"]["environment"]
    assert postgres_env["POSTGRES_PASSWORD"] == password
    urls = {services[name]["environment"].get("DATABASE_URL") for name in ("worker", "api")}
    assert len(urls) == 1, urls
    url = urlparse(urls.pop() or "")
    assert url.scheme == "postgresql" and url.hostname == "postgres" and url.port == 5432, url
    assert (url.username, url.password) == (postgres_env["POSTGRES_USER"], password)
    assert url.path == f"/{postgres_env['POSTGRES_DB']}"
    for name in ("worker", "api"):
        assert depends_on(services[name])["postgres"] == {"condition": "service_healthy"}, name


def test_postgres_runs_only_under_its_profile_with_a_health_check() -> None:
    spec = compose()
    postgres = spec["services"]["postgres"]
    assert postgres["profiles"] == [POSTGRES_PROFILE]
    assert re.fullmatch(r"postgres:1[56](\.\d+)*(-\w+)?", postgres["image"]), postgres["image"]
    test = postgres["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL" and test[1].startswith("pg_isready "), test
    # $$: the container's shell reads its own variables (a single $ is compose's, at parse time).
    assert '"$$POSTGRES_USER"' in test[1] and '"$$POSTGRES_DB"' in test[1], test
    assert postgres["restart"] == "unless-stopped"
    assert ("postgres-data", "/var/lib/postgresql/data", False) in mounts(postgres)
    assert "ports" not in postgres  # like Redis: on the compose network only
    # Set from .env, with defaults; never ${VAR:?} here, which would fail every command (the
    # SQLite deployment's too) while unset. The password has no default at all: the PostgreSQL
    # variant requires it (deploy/postgres.yml), and without it the image refuses to initialise.
    assert postgres["environment"] == {
        "POSTGRES_USER": "${POSTGRES_USER:-sophos}",
        "POSTGRES_DB": "${POSTGRES_DB:-sophos}",
    }


def test_the_default_deployment_is_sqlite_without_postgres() -> None:
    services = compose()["services"]
    started = active(services)
    assert "postgres" not in started
    for name in started:
        # Nothing started without the profile needs postgres (compose would refuse to start it).
        assert set(depends_on(services[name])) <= started, name
        assert "DATABASE_URL" not in (services[name].get("environment") or {}), name
    # The single SQLite writer, as before: its volume read-write, its concurrency from .env.
    worker = services["worker"]
    assert (DATA_VOLUME, "/data", False) in mounts(worker)
    assert worker["environment"]["WORKER_CONCURRENCY"] == "${WORKER_CONCURRENCY:-1}"


def test_the_postgres_override_points_worker_and_api_at_postgres() -> None:
    override = compose(POSTGRES_OVERRIDE)
    # The worker and the API change; postgres itself is the main file's, under the profile, and
    # gets only its password here, required: no default anyone could guess.
    assert set(override["services"]) == {"worker", "api", "postgres"}
    assert set(override["services"]["postgres"]) == {"environment"}
    required = re.compile(r"\$\{POSTGRES_PASSWORD:\?[^}]*POSTGRES_PASSWORD[^}]*\}")
    assert required.fullmatch(override["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"])
    assert "POSTGRES_PASSWORD:-" not in POSTGRES_OVERRIDE.read_text()
    merged = compose()["services"]
    for name, change in override["services"].items():
        merged[name]["environment"].update(change["environment"])
        merged[name]["depends_on"] = {**depends_on(merged[name]), **change.get("depends_on", {})}
    # Compose's defaults filled in and the password set, as with a .env naming only the password.
    for name in ("worker", "api", "postgres"):
        merged[name]["environment"] = {
            key: required.sub("chosen", re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value)))
            for key, value in merged[name]["environment"].items()
        }
    _postgres_url_checks(merged, "chosen")
    # The app's own parser takes the URL compose gives it, defaults filled in.
    from shared.settings import Settings

    url = override["services"]["worker"]["environment"]["DATABASE_URL"]
    filled = required.sub("chosen", re.sub(r"\$\{\w+:-(\w+)\}", r"\1", url))
    assert Settings.from_env({"DATABASE_URL": filled}).database_url == filled
    # What the main file had stays: Redis and Ollama waited for, WORKER_CONCURRENCY per worker.
    assert set(depends_on(merged["worker"])) == {"redis", "ollama", "postgres"}
    assert set(depends_on(merged["api"])) == {"redis", "postgres"}
    assert merged["worker"]["environment"]["WORKER_CONCURRENCY"] == "1"


def test_the_worker_can_be_scaled() -> None:
    """``--scale worker=N``: nothing in the worker is one of a kind (a name, a host port)."""
    files = [compose(), compose(POSTGRES_OVERRIDE)]
    for spec in files:
        worker = spec["services"]["worker"]
        assert "container_name" not in worker and "ports" not in worker, worker
        assert "hostname" not in worker
        # A host path other than the read-only config would be one file for N writers. (The
        # Store's volume is written by many on purpose, under SQLite's locks, and unused on
        # PostgreSQL, where the workers are scaled.)
        for source, _target, read_only in mounts(worker):
            assert source in (DATA_VOLUME, "sophos-store") or read_only, source
    # The API scales too (only the proxy publishes a port): none has a fixed name.
    for name, service in compose()["services"].items():
        assert "container_name" not in service, name


@pytest.mark.skipif(_compose_cli() is None, reason="no compose CLI (apt-get install docker-compose)")
def test_compose_cli_merges_the_postgres_variant(tmp_path: Path) -> None:
    cli = _compose_cli()
    assert cli is not None
    empty = tmp_path / "empty.env"
    empty.write_text("")
    default = _merged(cli, [COMPOSE], empty)["services"]
    for name in ("worker", "api"):
        assert "DATABASE_URL" not in default[name]["environment"], name
        assert "postgres" not in depends_on(default[name]), name
    assert default["postgres"]["profiles"] == [POSTGRES_PROFILE]  # config lists it; up does not start it

    # No default password: the PostgreSQL variant refuses to run until POSTGRES_PASSWORD is set.
    argv = [*cli, "--project-directory", str(REPO), "--env-file", str(empty),
            "-f", str(COMPOSE), "-f", str(POSTGRES_OVERRIDE), "--profile", POSTGRES_PROFILE, "config"]
    env = {k: v for k, v in os.environ.items() if k not in _POSTGRES_ENV}
    refused = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert refused.returncode != 0 and "POSTGRES_PASSWORD" in refused.stderr, refused.stderr

    password = tmp_path / "password.env"
    password.write_text("POSTGRES_PASSWORD=chosen-by-the-deployer\n")
    merged = _merged(cli, [COMPOSE, POSTGRES_OVERRIDE], password, (POSTGRES_PROFILE,))["services"]
    _postgres_url_checks(merged, "chosen-by-the-deployer")
    assert "container_name" not in merged["worker"] and "ports" not in merged["worker"]
    assert merged["worker"]["healthcheck"]["test"] == ["CMD", "python", "-m", "worker", "--check"]
    assert merged["worker"]["environment"]["WORKER_CONCURRENCY"] == "1"

    # The one-time alternative docs/deployment.md names: both switches and a password in .env.
    env_file = tmp_path / "postgres.env"
    env_file.write_text(
        "COMPOSE_FILE=docker-compose.yml:deploy/postgres.yml\n"
        f"COMPOSE_PROFILES={POSTGRES_PROFILE}\n"
        "POSTGRES_PASSWORD=not-the-default\nWORKER_CONCURRENCY=2\n"
    )
    from_env = _merged(cli, [], env_file)["services"]
    _postgres_url_checks(from_env, "not-the-default")
    assert from_env["worker"]["environment"]["WORKER_CONCURRENCY"] == "2"


# --- the API's read-only mount ----------------------------------------------------------------


#: Reads as the API does (shared/storage/reading.py): a read that fails (under load a reader of
#: a read-only -shm can find the WAL index mid-change: "attempt to write a readonly database")
#: retires the connection, and the next read opens another. One that cannot read at all fails.
_READER = """
import sqlite3, sys, time
uri = f"file:{sys.argv[1]}?mode=ro"
conn = sqlite3.connect(uri, uri=True)
seen = []
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    try:
        seen.append(conn.execute("select count(*) from t").fetchone()[0])
    except sqlite3.OperationalError as exc:
        if not seen:
            raise  # it cannot be read at all
        print("retried:", exc, file=sys.stderr)
        conn.close()
        conn = sqlite3.connect(uri, uri=True)
        continue
    if seen[-1] >= int(sys.argv[2]):
        break
    time.sleep(0.01)
print(seen[0], seen[-1], seen == sorted(seen))
"""


def _read_only_view(source: Path, tmp: Path) -> tuple[list[str], Path] | None:
    """A command prefix and a directory through which ``source`` cannot be written.

    A read-only bind mount, as Docker gives the API (in a mount namespace of the reader's
    own), where that is allowed; else, for a user other than root, the directory's modes.
    """
    if (
        shutil.which("unshare")
        and subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0
    ):
        view = tmp / "ro-view"
        view.mkdir()
        mount = f'mount --bind -o ro {source} {view} && exec "$@"'
        return ["unshare", "-m", "sh", "-c", mount, "sh"], view
    if os.geteuid() != 0:
        source.chmod(0o555)
        for entry in source.iterdir():
            entry.chmod(0o444)
        return [], source
    return None


def test_a_reader_on_a_read_only_mount_sees_each_commit(tmp_path: Path) -> None:
    """What the API's ``:ro`` mount gives it: the database, -wal and -shm it cannot write."""
    api = compose()["services"]["api"]
    assert (DATA_VOLUME, "/data", True) in mounts(api)
    data = tmp_path / "data"
    data.mkdir()
    writer = sqlite3.connect(data / "sophos.db", isolation_level=None, check_same_thread=False)
    try:
        writer.execute("pragma journal_mode=wal")
        writer.execute("create table t(x)")
        writer.execute("insert into t values (0)")
        assert (data / "sophos.db-shm").exists()
        view = _read_only_view(data, tmp_path)
        if view is None:
            pytest.skip("no way to make a read-only view here (root without mount namespaces)")
        prefix, directory = view
        target = 300
        probe = "import sys, pathlib; p = pathlib.Path(sys.argv[1]); p.write_bytes(p.read_bytes())"
        refused = subprocess.run(
            [*prefix, sys.executable, "-c", probe, str(directory / "sophos.db-shm")],
            capture_output=True,
            text=True,
        )
        assert refused.returncode != 0 and ("Read-only" in refused.stderr or "Permission" in refused.stderr)
        reader = subprocess.Popen(
            [*prefix, sys.executable, "-c", _READER, str(directory / "sophos.db"), str(target)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

        def write() -> None:
            for i in range(1, target):
                writer.execute("insert into t values (?)", (i,))
                time.sleep(0.005)

        writing = threading.Thread(target=write)
        writing.start()
        out, err = reader.communicate(timeout=60)
        writing.join()
        assert reader.returncode == 0, err
        first, last, in_order = out.split()
        # It read while the writer wrote, and saw the last commit: nothing stale, nothing lost.
        assert int(first) < target and int(last) == target and in_order == "True", out
        # Once the writer has closed (and removed -wal and -shm), a new reader cannot open it:
        # what api/store.py reports as DATABASE_UNAVAILABLE until the worker is back.
        writer.close()
        assert not (data / "sophos.db-shm").exists()
        after = subprocess.run(
            [*prefix, sys.executable, "-c", _READER, str(directory / "sophos.db"), "1"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert after.returncode != 0 and "sqlite3.OperationalError" in after.stderr, after
    finally:
        writer.close()
        for entry in [data, *data.iterdir()]:
            entry.chmod(0o755)


# --- nginx -----------------------------------------------------------------------------------


needs_nginx = pytest.mark.skipif(
    shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists(),
    reason="no nginx (apt-get install nginx-light)",
)


def _nginx() -> str:
    return shutil.which("nginx") or "/usr/sbin/nginx"


def _main_conf(tmp: Path, server_conf: Path) -> Path:
    """A main nginx.conf around a server snippet, as the nginx image's default one includes it."""
    main = tmp / "nginx-main.conf"
    temp = {k: tmp / f"nginx-{k}" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")}
    for path in temp.values():
        path.mkdir(exist_ok=True)
    temp_paths = "".join(f"  {k}_temp_path {v};\n" for k, v in temp.items())
    main.write_text(
        f"daemon off;\nmaster_process off;\npid {tmp / 'nginx.pid'};\nerror_log {tmp / 'nginx-error.log'};\n"
        f"events {{}}\nhttp {{\n{temp_paths}  include {server_conf};\n}}\n"
    )
    return main


def _substitute(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"deploy/nginx.conf no longer has exactly one {old!r}"
    return text.replace(old, new)


@pytest.fixture
def start_nginx(tmp_path: Path) -> Iterator[Callable[[int], int]]:
    """``start_nginx(api_port) -> port``: deploy/nginx.conf in a real nginx, sending to that API.

    Only the listening address, the API's address and the access log's path change.
    """
    started: list[subprocess.Popen[bytes]] = []

    def start(api_port: int) -> int:
        port = free_port()
        text = NGINX_CONF.read_text()
        text = _substitute(text, "listen 8000;", f"listen 127.0.0.1:{port};")
        text = _substitute(text, "http://api:8000;", f"http://127.0.0.1:{api_port};")
        text = _substitute(text, "/var/log/nginx/access.log", str(tmp_path / "nginx-access.log"))
        server_conf = tmp_path / "nginx-sophos.conf"
        server_conf.write_text(text)
        proc = subprocess.Popen(
            [_nginx(), "-c", str(_main_conf(tmp_path, server_conf)), "-p", str(tmp_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        started.append(proc)

        def listening() -> bool:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_for(listening, 10, message="nginx listening")
        return port

    yield start
    for proc in started:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _conf_seconds(directive: str) -> float:
    match = re.search(rf"^\s*{directive}\s+(\d+)s;", NGINX_CONF.read_text(), re.M)
    assert match, f"{directive} is not set in deploy/nginx.conf"
    return float(match.group(1))


def _envelope(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == code and body["error"]["message"], body


@needs_nginx
def test_nginx_answers_in_the_apis_error_envelope(
    sophos_env: SophosEnv, start_api, start_nginx, tmp_path: Path
) -> None:
    # The shipped file as it is, in the main configuration the nginx image wraps it in.
    checked = subprocess.run(
        [_nginx(), "-t", "-c", str(_main_conf(tmp_path, NGINX_CONF)), "-p", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr
    api = start_api(sophos_env)
    port = start_nginx(int(sophos_env["API_PORT"]))
    with http_client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        assert http.get("/api/healthz").status_code == 200  # through to the API
        limit = 1024 * 1024  # the API's MAX_BODY_BYTES default, and nginx's client_max_body_size
        too_large = http.post(
            "/api/chat", content=b"x" * (limit + 1), headers={"content-type": "application/json"}
        )
        _envelope(too_large, 413, "PAYLOAD_TOO_LARGE")
        # The same answer the API itself gives.
        direct = httpx.post(
            f"{api.url}/api/chat",
            content=b"x" * (limit + 1),
            headers={"content-type": "application/json"},
            timeout=30,
        )
        _envelope(direct, 413, "PAYLOAD_TOO_LARGE")
        assert direct.json()["error"]["message"] == too_large.json()["error"]["message"]
        api.stop()
        _envelope(http.get("/api/healthz"), 503, "SERVICE_UNAVAILABLE")


@needs_nginx
def test_nginx_drops_a_client_that_sends_its_headers_slowly(start_nginx) -> None:
    # The API has no header timeout: the proxy bounds it. A slowloris client sends a header
    # byte every half second, never finishing; nginx must close the connection.
    header_timeout = _conf_seconds("client_header_timeout")
    assert _conf_seconds("client_body_timeout") <= 60
    port = start_nginx(free_port())  # nothing behind it: the request never gets that far
    started = time.monotonic()
    deadline = started + header_timeout + 20  # nginx's default is 60 s: this fails without the setting
    closed = False
    with socket.create_connection(("127.0.0.1", port), timeout=0.5) as conn:
        conn.sendall(b"GET /api/healthz HTTP/1.1\r\nHost: sophos\r\n")
        while not closed and time.monotonic() < deadline:
            try:
                conn.sendall(b"X")
                conn.recv(4096)  # b"" (closed) or a 408: either way nginx ended it
                closed = True
            except TimeoutError:
                continue  # still open: nothing to read within 0.5 s
            except OSError:  # reset, broken pipe
                closed = True
    assert closed, f"connection still open after {time.monotonic() - started:.0f}s"
    assert time.monotonic() - started >= header_timeout - 1


# --- the image's layers and its build context -------------------------------------------------


def _final_stage() -> list[str]:
    """The Dockerfile's last stage, one instruction per line (continuations joined)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    starts = [i for i, line in enumerate(lines) if line.startswith("FROM ")]
    return lines[starts[-1]:]


def test_the_image_installs_locked_dependencies_before_the_source() -> None:
    """A code change rebuilds only the last layers: the dependencies come from the lock first."""
    stage = _final_stage()
    locked = [i for i, line in enumerate(stage)
              if line.startswith("RUN ") and "-c /tmp/requirements.lock" in line]
    assert len(locked) == 1, stage
    # Before it, nothing of the service's sources: only the dependency list and the lock.
    for line in stage[:locked[0]]:
        if line.startswith(("COPY", "ADD")):
            assert "requirements" in line, line
    # The service arrives after it, as a wheel built in the first stage; never its source tree.
    wheel = [i for i, line in enumerate(stage) if line.startswith("COPY --from=build /dist")]
    assert wheel and wheel[0] > locked[0], stage
    for package in ("api", "worker", "shared", "sophos_cli", "web"):
        copies = [line for line in stage if line.startswith("COPY ") and line.split()[1] == package]
        assert not copies, copies


def test_the_image_has_a_default_command_and_a_health_check() -> None:
    stage = _final_stage()
    commands = [line for line in stage if line.startswith("CMD ")]
    assert commands and json.loads(commands[-1][4:]) == ["sophos", "api"]
    checks = [line for line in stage if line.startswith("HEALTHCHECK ")]
    assert checks and "/api/healthz" in checks[-1], checks
    # The console script it runs is the package's (pyproject.toml, [project.scripts]).
    assert 'sophos = "sophos_cli.entry:main"' in (REPO / "pyproject.toml").read_text()


def test_the_build_context_leaves_out_secrets_environments_and_data() -> None:
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    for entry in (".venv", "data/", ".env", ".git"):
        assert entry in ignored, entry
    # What the Dockerfile copies from the context stays in it.
    copied = {line.split()[1] for line in DOCKERFILE.read_text().splitlines()
              if line.startswith("COPY ") and not line.startswith("COPY --from")}
    assert copied == {"pyproject.toml", "requirements.lock", "api", "worker", "shared", "sophos_cli", "web"}
    assert not copied & {entry.rstrip("/") for entry in ignored}
