// The calls agent-chat-ui (github langchain-ai/agent-chat-ui, read at fdc87e6) makes against a
// LangGraph server, through the SDK version its lockfile pins, in the fewest lines that keep them:
// the UI itself is not published to a package registry (docs/agent-protocol.md, "agent-chat-ui").
// Each part names the file of agent-chat-ui whose behaviour it keeps.
import React, { useCallback, useEffect, useMemo, useState } from "react";
import { createRoot } from "react-dom/client";
import { Client } from "@langchain/langgraph-sdk";
import { useStream } from "@langchain/langgraph-sdk/react";

const END = "__end__"; // @langchain/langgraph's END, what "Mark as resolved" sends
const DO_NOT_RENDER = "do-not-render-"; // src/lib/ensure-tool-responses.ts
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

const params = () => new URLSearchParams(window.location.search);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function setThreadParam(id) { // nuqs's useQueryState("threadId")
  const query = params();
  if (id) query.set("threadId", id); else query.delete("threadId");
  window.history.replaceState(null, "", `?${query}`);
}

function textOf(content) {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content.filter((b) => b.type === "text").map((b) => b.text).join("");
}

// src/lib/ensure-tool-responses.ts: an AI message whose tool calls have no tool message after it
// gets one per call, sent before the new human message.
function ensureToolCallsHaveResponses(messages) {
  const added = [];
  messages.forEach((message, index) => {
    if (message.type !== "ai" || !message.tool_calls?.length) return;
    if (messages[index + 1]?.type === "tool") return;
    for (const call of message.tool_calls) {
      added.push({
        type: "tool", tool_call_id: call.id ?? "", id: `${DO_NOT_RENDER}${crypto.randomUUID()}`,
        name: call.name, content: "Successfully handled tool call.",
      });
    }
  });
  return added;
}

// src/providers/Thread.tsx: threads of this assistant (by graph_id, or assistant_id for a UUID)
function searchMetadata(assistantId) {
  return UUID.test(assistantId) ? { assistant_id: assistantId } : { graph_id: assistantId };
}

// src/lib/agent-inbox-interrupt.ts: langchain's HumanInTheLoopMiddleware request
function isHitl(interrupt) {
  const value = Array.isArray(interrupt) ? interrupt[0]?.value : interrupt?.value;
  return !!value && Array.isArray(value.action_requests) && value.action_requests.length > 0
    && Array.isArray(value.review_configs) && value.review_configs.length > 0;
}

// src/components/thread/history/index.tsx: a thread's title is its first message, else its id
function ThreadList({ threads, current, onPick }) {
  return (
    <aside aria-label="Thread history">
      <h2>Thread History</h2>
      <button onClick={() => onPick(null)}>+ New thread</button>
      {threads.map((t) => {
        const first = t.values?.messages?.[0];
        const title = first ? textOf(first.content) || t.thread_id : t.thread_id;
        return (
          <button key={t.thread_id} className="thread" aria-current={t.thread_id === current}
                  title={t.thread_id} onClick={() => onPick(t.thread_id)}>{title}</button>
        );
      })}
    </aside>
  );
}

// src/components/thread/agent-inbox: one decision for the first action request
// (hooks/use-interrupted-actions.tsx resumes with [decision]; utils.ts builds it)
function Approval({ stream, interrupt, toast }) {
  const request = (Array.isArray(interrupt) ? interrupt[0] : interrupt).value.action_requests[0];
  const [args, setArgs] = useState(JSON.stringify(request.args));
  const [reason, setReason] = useState("");
  const resume = (decision) => {
    stream.submit({}, { command: { resume: { decisions: [decision] } } });
    toast("Response submitted successfully.");
  };
  const edit = () => {
    let parsed;
    try { parsed = JSON.parse(args); } catch { toast("The arguments are not JSON."); return; }
    resume({ type: "edit", edited_action: { name: request.name, args: parsed } });
  };
  const reject = () => {
    if (!reason.trim()) { toast("Please enter a response."); return; }
    resume({ type: "reject", message: reason.trim() });
  };
  const resolve = () => { // handleResolve
    stream.submit({}, { command: { goto: END } });
    toast("Marked thread as resolved.");
  };
  return (
    <div className="interrupt" aria-label="Approval">
      <strong>{request.name}</strong>
      <pre>{request.description}</pre>
      <label>Arguments <textarea aria-label="Arguments" value={args} onChange={(e) => setArgs(e.target.value)} /></label>
      <label>Response <textarea aria-label="Response" value={reason} onChange={(e) => setReason(e.target.value)} /></label>
      <div>
        <button onClick={() => resume({ type: "approve" })}>Approve</button>
        <button onClick={edit}>Edit</button>
        <button onClick={reject}>Reject</button>
        <button onClick={resolve}>Mark as resolved</button>
      </div>
    </div>
  );
}

function Message({ message }) {
  if (message.type === "human") return <div className="human">{textOf(message.content)}</div>;
  if (message.type === "tool") {
    return <div className="tool-result" aria-label="Tool result">{message.name}: {textOf(message.content)}</div>;
  }
  return (
    <div className="ai">
      {textOf(message.content) && <div className="answer">{textOf(message.content)}</div>}
      {(message.tool_calls ?? []).map((c) => (
        <div key={c.id} className="tool-call" aria-label="Tool call">{c.name} {JSON.stringify(c.args)}</div>
      ))}
    </div>
  );
}

function App() {
  const apiUrl = params().get("apiUrl");
  const assistantId = params().get("assistantId") || "agent";
  const [threadId, setThreadId] = useState(params().get("threadId"));
  const [threads, setThreads] = useState([]);
  const [input, setInput] = useState("");
  const [notice, setNotice] = useState(null);
  const client = useMemo(() => new Client({ apiUrl }), [apiUrl]);
  const getThreads = useCallback(
    () => client.threads.search({ metadata: searchMetadata(assistantId), limit: 100 }),
    [client, assistantId],
  );
  useEffect(() => { getThreads().then(setThreads).catch(console.error); }, [getThreads]);
  const pick = (id) => { setThreadId(id); setThreadParam(id); };
  const toast = (text) => setNotice(text);

  // src/providers/Stream.tsx
  const stream = useStream({
    apiUrl, assistantId, threadId: threadId ?? null, fetchStateHistory: true,
    onThreadId: (id) => {
      pick(id);
      // "Wait for some seconds before fetching so we're able to get the new thread that was created."
      sleep(4000).then(() => getThreads().then(setThreads).catch(console.error));
    },
  });

  // src/components/thread/index.tsx: handleSubmit
  const submit = (event) => {
    event.preventDefault();
    if (!input.trim() || stream.isLoading) return;
    const human = { id: crypto.randomUUID(), type: "human", content: [{ type: "text", text: input }] };
    const toolMessages = ensureToolCallsHaveResponses(stream.messages);
    stream.submit(
      { messages: [...toolMessages, human], context: undefined },
      {
        streamMode: ["values"], streamSubgraphs: true, streamResumable: true,
        optimisticValues: (prev) => ({ ...prev, messages: [...(prev.messages ?? []), ...toolMessages, human] }),
      },
    );
    setInput("");
  };

  const shown = stream.messages.filter((m) => !m.id?.startsWith(DO_NOT_RENDER));
  const error = stream.error?.message;
  return (
    <>
      <ThreadList threads={threads} current={threadId} onPick={pick} />
      <main>
        <div id="messages" aria-busy={stream.isLoading}>
          {shown.map((m, i) => <Message key={m.id ?? i} message={m} />)}
          {isHitl(stream.interrupt) && <Approval key={JSON.stringify(stream.interrupt)} stream={stream}
                                                 interrupt={stream.interrupt} toast={toast} />}
          {stream.interrupt && !isHitl(stream.interrupt) && (
            <pre className="interrupt" aria-label="Interrupt">{JSON.stringify(stream.interrupt)}</pre>
          )}
        </div>
        {error && <div role="alert">An error occurred. Please try again. Error: <code>{error}</code></div>}
        {notice && <div className="toast" role="status">{notice}</div>}
        <form onSubmit={submit}>
          <textarea aria-label="Message" placeholder="Type your message..." value={input}
                    onChange={(e) => setInput(e.target.value)}
                    onKeyDown={(e) => { if (e.key === "Enter" && !e.shiftKey) submit(e); }} />
          {stream.isLoading
            ? <button type="button" onClick={() => stream.stop()}>Cancel</button>
            : <button type="submit">Send</button>}
        </form>
      </main>
    </>
  );
}

createRoot(document.getElementById("root")).render(<App />);
