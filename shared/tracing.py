"""Traces over OTLP: the one module that knows OpenTelemetry.

With ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set
(``Settings.tracing``), :func:`setup` loads the OpenTelemetry SDK and its OTLP/HTTP exporter
behind a ``BatchSpanProcessor``; the SDK reads the other standard ``OTEL_*`` variables itself
(headers, timeout, ``OTEL_BSP_SCHEDULE_DELAY``, ``OTEL_RESOURCE_ATTRIBUTES``...). Unset, this
module imports nothing of OpenTelemetry (no SDK pipeline, no exporter, no protobuf, no thread;
langsmith, under langchain-core, imports the bare ``opentelemetry.sdk.trace`` by itself when it
is installed): every helper here starts with one look at a module global and does nothing else,
and the hooks that only tracing needs (:func:`step`, :class:`TracedCheckpoints`,
:func:`add_trace_ids`) are not even installed.

One trace per run, from ``POST /api/chat`` to the run's end: the request and the enqueue in
the API; the job carries the enqueue span's W3C ``traceparent`` (``RunJob.traceparent``), and
the worker continues it with the queue wait, the run, each graph step, each model call (GenAI
conventions), each tool call (with its ledger state) and each checkpoint write. A run stamps
its ``traceparent`` on every checkpoint it writes (:func:`stamp`), so a resume or a decision,
which starts a trace of its own, links to the run whose thread it continues; the ending of a
run whose worker died (start-up recovery, a lease take-over) is a span in that run's trace.

Helpers, not boilerplate: code elsewhere opens a span with :func:`span` (or :func:`run`,
:func:`model_call`), and adds to the current one with :func:`annotate`.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shared.contracts.jobs import RunJob
    from shared.settings import Settings

#: the tracer once :func:`setup` ran with tracing on; None: every helper does nothing
_tracer: Any = None
_provider: Any = None
_otel: Any = None  # the ``opentelemetry.trace`` module, once loaded

#: exceptions that stop a span without being its failure: LangGraph's interrupt and drain,
#: a cancel's cut (matched by name, so nothing of LangGraph is imported for it)
_CONTROL = frozenset({"GraphBubbleUp", "CancelledError"})

Attributes = Mapping[str, Any]


class _NoSpan:
    """What the helpers yield when tracing is off: takes every call, keeps nothing."""

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def set_attributes(self, attributes: Attributes) -> None:
        pass

    def add_event(self, name: str, attributes: Attributes | None = None) -> None:
        pass


NO_SPAN = _NoSpan()


def enabled() -> bool:
    return _tracer is not None


def setup(settings: Settings, service: str) -> bool:
    """Export this process's spans over OTLP/HTTP when ``settings.tracing``; True if it does."""
    global _tracer, _provider, _otel
    if not settings.tracing or _tracer is not None:
        return _tracer is not None
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # service.name is ours (the API and the worker must be told apart); OTEL_RESOURCE_ATTRIBUTES adds.
    resource = Resource.create({"service.name": service, "service.namespace": "sophos"})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _provider, _otel = provider, trace
    _tracer = provider.get_tracer("sophos")
    return True


def shutdown() -> None:
    """Export what is still buffered, then stop (a graceful exit; a SIGKILL loses the buffer)."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


# --- context --------------------------------------------------------------------------------


def _context_of(traceparent: str | None) -> Any:
    if not traceparent:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


def _link(traceparent: str | None) -> Any:
    context = _context_of(traceparent)
    if context is None:
        return None
    span_context = _otel.get_current_span(context).get_span_context()
    return _otel.Link(span_context) if span_context.is_valid else None


def traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span (what a job carries); None without one."""
    if _tracer is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")


def incoming(headers: Mapping[str, str]) -> str | None:
    """A request's own ``traceparent`` header (a caller's trace), to continue it."""
    return headers.get("traceparent") if _tracer is not None else None


def stamp() -> dict[str, str]:
    """``{"traceparent": ...}`` of the current span for a checkpoint's metadata; {} when off."""
    parent = traceparent()
    return {"traceparent": parent} if parent else {}


def link_to(metadata: Mapping[str, Any] | None) -> None:
    """Link the current span to the run that stamped ``metadata`` (a checkpoint's), if any."""
    if _tracer is None or not metadata:
        return
    link = _link(metadata.get("traceparent"))
    current = _otel.get_current_span()
    if link is not None and current.is_recording():
        current.add_link(link.context, {"sophos.link": "continues"})


def annotate(attributes: Attributes) -> None:
    """Set ``attributes`` on the current span (None values skipped)."""
    if _tracer is None:
        return
    current = _otel.get_current_span()
    if current.is_recording():
        current.set_attributes({k: v for k, v in attributes.items() if v is not None})


def in_trace() -> bool:
    """True while a span of ours is current (a run's work, not upkeep between runs)."""
    return _tracer is not None and _otel.get_current_span().is_recording()


# --- spans ----------------------------------------------------------------------------------


def _ended(span: Any, exc: BaseException) -> None:
    """How a span ends on ``exc``: an interrupt, a drain or a cut is no failure."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & _CONTROL:
        span.set_attribute("sophos.stopped", type(exc).__name__)
        return
    from opentelemetry.trace import Status, StatusCode

    # Its type or code, never its text: an exception's message can quote a tool's arguments, a URL
    # with its token, a server's answer; a trace goes to whoever runs the collector. The text is
    # in the log, where secrets are taken out (worker/tools/config.py).
    error = getattr(exc, "code", None) or type(exc).__name__
    span.add_event("exception", {"exception.type": type(exc).__qualname__})
    span.set_attributes({"error.type": error})
    span.set_status(Status(StatusCode.ERROR, str(error)))


@contextmanager
def span(
    name: str,
    attributes: Attributes | None = None,
    *,
    kind: str = "internal",
    parent: str | None = None,
    links: Sequence[str | None] = (),
    start: float | None = None,
) -> Iterator[Any]:
    """A span around the block, current inside it (a child of the current span, or of
    ``parent``, a ``traceparent``); ``links``: traceparents it refers to; ``start``: a
    ``time.time()`` when it began earlier than now. Yields the span (:data:`NO_SPAN` when off)."""
    if _tracer is None:
        yield NO_SPAN
        return
    with _tracer.start_as_current_span(
        name,
        context=_context_of(parent),
        kind=getattr(_otel.SpanKind, kind.upper()),
        attributes={k: v for k, v in (attributes or {}).items() if v is not None},
        links=[link for link in map(_link, links) if link is not None],
        start_time=int(start * 1e9) if start is not None else None,
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        try:
            yield current
        except BaseException as exc:
            _ended(current, exc)
            raise


@contextmanager
def run(job: RunJob) -> Iterator[Any]:
    """A run's span in the worker, continuing the job's trace; the queue wait before it."""
    if _tracer is None:
        yield NO_SPAN
        return
    ids = {"sophos.run.id": job.run_id, "sophos.conversation.id": job.conversation_id}
    with span("queue wait", ids, parent=job.traceparent, start=min(job.enqueued_at, time.time())):
        pass
    with span(
        "run", {**ids, "sophos.run.kind": job.kind.value, "messaging.system": "arq",
                "messaging.operation.type": "process"},
        kind="consumer", parent=job.traceparent,
    ) as current:
        yield current


def step(node: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a graph node) in a span per execution, with LangGraph's step number; ``fn``
    itself when tracing is off (the graph is built after :func:`setup`)."""
    if _tracer is None:
        return fn

    def attributes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        config = kwargs.get("config") or next(
            (a for a in args if isinstance(a, dict) and "metadata" in a), {}
        )
        meta = config.get("metadata") or {}
        return {"langgraph.node": node, "langgraph.step": meta.get("langgraph_step")}

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def traced(*args: Any, **kwargs: Any) -> Any:
            with span(f"step {node}", attributes(args, kwargs)):
                return await fn(*args, **kwargs)
        return traced

    @functools.wraps(fn)
    def traced_sync(*args: Any, **kwargs: Any) -> Any:
        with span(f"step {node}", attributes(args, kwargs)):
            return fn(*args, **kwargs)
    return traced_sync


# --- model calls (GenAI semantic conventions) -----------------------------------------------


class ModelCall:
    """One chat-model call's span: :meth:`config` adds a first-token probe to the call's
    config, :meth:`answered` records the token counts Ollama reported."""

    def __init__(self, span: Any) -> None:
        self.span = span
        self.started = time.monotonic()

    def config(self, config: Any) -> Any:
        if self.span is NO_SPAN:
            return config
        from langchain_core.runnables.config import merge_configs

        return merge_configs(config, {"callbacks": [_first_token_probe(self)]})

    def first_token(self) -> None:
        self.span.set_attribute("gen_ai.server.time_to_first_token", time.monotonic() - self.started)
        self.span.add_event("gen_ai.first_token")

    def answered(self, message: Any) -> None:
        if self.span is NO_SPAN:
            return
        meta = getattr(message, "response_metadata", None) or {}
        usage = getattr(message, "usage_metadata", None) or {}
        self.span.set_attributes({k: v for k, v in {
            "gen_ai.response.model": meta.get("model"),
            # Ollama's own counts: prompt_eval_count, eval_count
            "gen_ai.usage.input_tokens": meta.get("prompt_eval_count", usage.get("input_tokens")),
            "gen_ai.usage.output_tokens": meta.get("eval_count", usage.get("output_tokens")),
            "gen_ai.response.finish_reasons": [meta["done_reason"]] if meta.get("done_reason") else None,
        }.items() if v is not None})


def _first_token_probe(call: ModelCall) -> Any:
    from langchain_core.callbacks import BaseCallbackHandler

    class FirstToken(BaseCallbackHandler):
        run_inline = True  # called in the event loop, not in a thread

        def __init__(self) -> None:
            self.seen = False

        def on_llm_new_token(self, token: Any, **kwargs: Any) -> None:
            if not self.seen:
                self.seen = True
                call.first_token()

    return FirstToken()


@contextmanager
def model_call(model: str | None) -> Iterator[ModelCall]:
    """A span for one chat call to Ollama (``chat {model}``, GenAI conventions)."""
    if _tracer is None:
        yield ModelCall(NO_SPAN)
        return
    with span(f"chat {model}", {
        "gen_ai.operation.name": "chat", "gen_ai.system": "ollama", "gen_ai.provider.name": "ollama",
        "gen_ai.request.model": model,
    }, kind="client") as current:
        yield ModelCall(current)


# --- checkpoint writes and logs -------------------------------------------------------------


class TracedCheckpoints:
    """Mixed in before the saver's class (``open_checkpointer(hooks=...)``): each checkpoint
    write of a run is a span (writes outside a run, upkeep's, are not traced)."""

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        if not in_trace():
            return await super().aput(config, checkpoint, metadata, new_versions)  # type: ignore[misc]
        with span("checkpoint write", {"sophos.checkpoint.kind": "checkpoint",
                                       "langgraph.step": (metadata or {}).get("step")}):
            return await super().aput(config, checkpoint, metadata, new_versions)  # type: ignore[misc]

    async def aput_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> Any:
        if not in_trace():
            return await super().aput_writes(config, writes, task_id, task_path)  # type: ignore[misc]
        with span("checkpoint write", {"sophos.checkpoint.kind": "writes", "langgraph.task_id": task_id,
                                       "sophos.checkpoint.writes": len(writes)}):
            return await super().aput_writes(config, writes, task_id, task_path)  # type: ignore[misc]


def checkpoint_hooks() -> list[type]:
    """The saver hooks tracing needs: none when it is off."""
    return [TracedCheckpoints] if _tracer is not None else []


def add_trace_ids(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: ``trace_id`` and ``span_id`` of the current span, when there is one."""
    if _tracer is not None:
        context = _otel.get_current_span().get_span_context()
        if context.is_valid:
            event.setdefault("trace_id", format(context.trace_id, "032x"))
            event.setdefault("span_id", format(context.span_id, "016x"))
    return event
