"""One trace, drawn as a waterfall: the spans a run exported (tests/support/otlp.py), each a row
under its parent, a bar from its start to its end on the trace's clock.

For the screenshot of a real run's trace in the manual (docs/operating.md, "Traces"): no trace
viewer runs on the test machine, so tests/test_tracing.py draws what the receiver got with this
page, opens it in Chromium and checks every span is on it before it takes the picture.
"""

from __future__ import annotations

import html

from tests.support.otlp import Span

#: a span's row: the keys its label shows, where the span has them
LABELLED = (
    "langgraph.step", "gen_ai.usage.output_tokens", "gen_ai.tool.name", "sophos.tool.ledger",
    "sophos.checkpoint.kind", "sophos.run.status",
)


def in_tree_order(spans: list[Span]) -> list[tuple[int, Span]]:
    """``(depth, span)``, each span after its parent, siblings by start; roots are the spans whose
    parent is not in ``spans``."""
    ids = {s.span_id for s in spans}
    below: dict[str | None, list[Span]] = {}
    for span in spans:
        parent = span.parent_id if span.parent_id in ids else None
        below.setdefault(parent, []).append(span)
    ordered: list[tuple[int, Span]] = []

    def visit(parent: str | None, depth: int) -> None:
        for span in sorted(below.get(parent, []), key=lambda s: s.start_ns):
            ordered.append((depth, span))
            visit(span.span_id, depth + 1)

    visit(None, 0)
    return ordered


def page(spans: list[Span], title: str) -> str:
    """The trace as a self-contained HTML page (no script, nothing fetched)."""
    start = min(s.start_ns for s in spans)
    total = max(s.end_ns for s in spans) - start or 1
    rows = []
    for depth, span in in_tree_order(spans):
        left = 100 * (span.start_ns - start) / total
        width = max(100 * (span.end_ns - span.start_ns) / total, 0.3)
        shown = [k for k in LABELLED if k in span.attributes]
        details = ", ".join(f"{k.rsplit('.', 1)[-1]}={span.attributes[k]}" for k in shown)
        label = f"{span.name}" + (f" ({details})" if details else "")
        rows.append(
            f'<div class="row" data-span="{span.span_id}">'
            f'<div class="name" style="padding-left:{depth * 14}px">{html.escape(label)}</div>'
            f'<div class="lane"><div class="bar {span.service}"'
            f' style="left:{left:.2f}%;width:{width:.2f}%"></div></div>'
            f'<div class="ms">{(span.end_ns - span.start_ns) / 1e6:.1f} ms</div></div>'
        )
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>
body {{ font: 13px system-ui, sans-serif; margin: 16px; color: #1d1d1f; }}
h1 {{ font-size: 15px; margin: 0 0 10px; }}
.row {{ display: grid; grid-template-columns: 430px 1fr 80px; align-items: center;
  border-bottom: 1px solid #eee; }}
.name {{ white-space: nowrap; overflow: hidden; text-overflow: ellipsis; padding: 3px 0; }}
.lane {{ position: relative; height: 14px; }}
.bar {{ position: absolute; top: 2px; height: 10px; border-radius: 2px; }}
.sophos-api {{ background: #3b82f6; }} .sophos-worker {{ background: #16a34a; }}
.ms {{ text-align: right; color: #666; font-variant-numeric: tabular-nums; }}
.legend span {{ display: inline-block; width: 10px; height: 10px; margin: 0 4px 0 12px; }}
</style></head><body><h1>{html.escape(title)}</h1>
<p class="legend"><span class="sophos-api"></span>sophos-api<span class="sophos-worker"></span>sophos-worker
 &middot; {len(spans)} spans, {total / 1e6:.1f} ms</p>
{''.join(rows)}</body></html>"""
