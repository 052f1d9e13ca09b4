"""How the client prints: answers as they stream, tables, durations, one-line excerpts."""

from __future__ import annotations

import json
from typing import Any, TextIO

#: longest tool call or result printed (the full one is in the conversation)
RESULT_CHARS = 300


def duration(ms: int | float | None) -> str:
    if ms is None:
        return "-"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def short(value: Any, limit: int = RESULT_CHARS) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        out.write("  ".join(cells).rstrip() + "\n")


def tool_call_line(name: Any, arguments: Any) -> str:
    return f"[tool] {name}({short(arguments if arguments is not None else {})})"


def tool_result_line(name: Any, result: Any, error: bool = False) -> str:
    return f"[tool] {name} ->{' (error)' if error else ''} {short(result if result is not None else '')}"


class ChatPrinter:
    """Tokens as they come; a tool call or result on a line of its own."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.mid_line = False

    def line(self, text: str) -> None:
        if self.mid_line:
            self.out.write("\n")
        self.out.write(text + "\n")
        self.out.flush()
        self.mid_line = False

    def token(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()
        self.mid_line = not text.endswith("\n")

    def trace(self, data: dict[str, Any]) -> None:
        body = data.get("data") or {}
        if data.get("event") == "call":
            self.line(tool_call_line(body.get("name"), body.get("arguments", {})))
        elif data.get("event") == "result":
            error = body.get("status") == "error"
            self.line(tool_result_line(body.get("name"), body.get("result", ""), error))

    def finish(self) -> None:
        if self.mid_line:
            self.out.write("\n")
            self.out.flush()
        self.mid_line = False
