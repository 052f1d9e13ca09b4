# One image for both processes; docker-compose picks the command. config/ is not in the
# image: compose mounts ./config at /app/config (CONFIG_DIR).
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends nodejs npm \
    && rm -rf /var/lib/apt/lists/*
# The processes run as this user; /data (the sophos-data volume: database, memory file) is
# its own. A new named volume takes the ownership of the image's directory it is mounted on.
RUN useradd --system --uid 10001 --create-home --home-dir /home/sophos --shell /usr/sbin/nologin sophos \
    && mkdir -p /data/db /data/memory \
    && chown -R sophos:sophos /data
WORKDIR /app
COPY pyproject.toml requirements.lock ./
COPY api api
COPY worker worker
COPY shared shared
COPY sophos_cli sophos_cli
COPY web web
RUN pip install --no-cache-dir -c requirements.lock . \
    && cd "$(python -c 'import os, readabilipy; print(os.path.dirname(readabilipy.__file__))')/javascript" \
    && npm install --no-audit --no-fund
USER sophos
ENV HOME=/home/sophos
# The memory server, at the exact version config/mcp.json names, in npx's cache of this
# user. npx asks the registry for the package's metadata at every start, even for an exact
# version installed globally (measured with npm 11): offline=true makes it use this cache,
# so the worker starts on a network without the registry. Change the version here and in
# config/mcp.json together (tests/test_deploy.py checks they are the same).
RUN npx -y @modelcontextprotocol/server-memory@2026.8.31 </dev/null \
    && printf 'offline=true\nupdate-notifier=false\nfund=false\naudit=false\n' > "$HOME/.npmrc"
ENV LANGGRAPH_STRICT_MSGPACK=true \
    DATABASE_PATH=/data/db/sophos.db \
    MEMORY_FILE_PATH=/data/memory/memory.jsonl \
    CONFIG_DIR=/app/config
