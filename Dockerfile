# One image for both processes; docker-compose picks the command.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends nodejs npm \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml requirements.lock ./
COPY api api
COPY worker worker
COPY shared shared
COPY sophos_cli sophos_cli
COPY config config
COPY web web
RUN pip install --no-cache-dir -c requirements.lock . \
    && npm install -g @modelcontextprotocol/server-memory \
    && cd "$(python -c 'import os, readabilipy; print(os.path.dirname(readabilipy.__file__))')/javascript" \
    && npm install --no-audit --no-fund
ENV LANGGRAPH_STRICT_MSGPACK=true \
    DATABASE_PATH=/data/db/sophos.db \
    MEMORY_FILE_PATH=/data/memory/memory.jsonl \
    CONFIG_DIR=/app/config
