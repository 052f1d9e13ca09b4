# One image for both processes: `sophos api` by default; docker-compose runs the worker with
# `python -m worker` (the same as `sophos worker`). config/ is not in the image: compose mounts
# ./config at /app/config (CONFIG_DIR).
#
# Layers, slowest-changing first: system packages and the user; the locked runtime
# dependencies (rebuilt only when pyproject.toml's dependency list or requirements.lock
# changes); the memory server; then the service's own wheel (every code change lands here,
# a few seconds). The sources are built into a wheel in the first stage and never copied into
# the image: it runs from site-packages, as any installed package does.

# --- build: the dependency list alone, then the wheel of the service ------------------------
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml ./
# The runtime dependencies as pyproject.toml names them (the test and docs extras left out).
RUN python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep=chr(10))" \
    > /requirements.txt
COPY api api
COPY worker worker
COPY shared shared
COPY sophos_cli sophos_cli
COPY web web
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

# --- the image -------------------------------------------------------------------------------
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends nodejs npm \
    && rm -rf /var/lib/apt/lists/*
# The processes run as this user; /data (the sophos-data volume: database, memory file) and
# /store (the sophos-store volume: the Store's items, STORE_PATH) are its own. A new named volume
# takes the ownership of the image's directory it is mounted on.
RUN useradd --system --uid 10001 --create-home --home-dir /home/sophos --shell /usr/sbin/nologin sophos \
    && mkdir -p /data/db /data/memory /store \
    && chown -R sophos:sophos /data /store
WORKDIR /app
# The locked dependencies, before any source: a code change reuses this layer.
COPY --from=build /requirements.txt /tmp/requirements.txt
COPY requirements.lock /tmp/requirements.lock
RUN pip install --no-cache-dir -c /tmp/requirements.lock -r /tmp/requirements.txt \
    && cd "$(python -c 'import os, readabilipy; print(os.path.dirname(readabilipy.__file__))')/javascript" \
    && npm install --no-audit --no-fund \
    && rm /tmp/requirements.txt /tmp/requirements.lock
USER sophos
ENV HOME=/home/sophos
# The memory server, at the exact version config/mcp.json names, in npx's cache of this
# user. npx asks the registry for the package's metadata at every start, even for an exact
# version installed globally (measured with npm 11): offline=true makes it use this cache,
# so the worker starts on a network without the registry. Change the version here and in
# config/mcp.json together (tests/test_deploy.py checks they are the same).
RUN npx -y @modelcontextprotocol/server-memory@2026.8.31 </dev/null \
    && printf 'offline=true\nupdate-notifier=false\nfund=false\naudit=false\n' > "$HOME/.npmrc"
# The service itself, last: its packages and the page (web/, package data beside them).
USER root
COPY --from=build /dist /tmp/dist
RUN pip install --no-cache-dir --no-deps /tmp/dist/*.whl && rm -rf /tmp/dist
USER sophos
ENV LANGGRAPH_STRICT_MSGPACK=true \
    DATABASE_PATH=/data/db/sophos.db \
    MEMORY_FILE_PATH=/data/memory/memory.jsonl \
    CONFIG_DIR=/app/config
EXPOSE 8000
# The API's liveness, as compose's api service checks it (compose gives the worker its own).
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/api/healthz')"]
CMD ["sophos", "api"]
