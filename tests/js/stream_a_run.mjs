// Drives Sophos with the JavaScript LangGraph SDK (@langchain/langgraph-sdk), as a browser app
// or agent-chat-ui would: create a thread, stream a run (resumable, as useStream does), rejoin
// it with lastEventId "-1", read the thread's state. Prints one JSON object on stdout.
// Run by tests/test_agent_protocol.py (tests/support/js_sdk.py installs the SDK beside a copy).
import { Client } from "@langchain/langgraph-sdk";

const [apiUrl, message] = process.argv.slice(2);
const client = new Client({ apiUrl });

const thread = await client.threads.create({ metadata: { via: "js" } });
const created = [];
const streamed = [];
for await (const part of client.runs.stream(thread.thread_id, "agent", {
  input: { messages: [{ role: "user", content: message }] },
  streamMode: ["messages-tuple", "values"],
  streamResumable: true,
  onRunCreated: (run) => created.push(run),
})) {
  streamed.push({ event: part.event, data: part.data, id: part.id ?? null });
}
const runId = created[0]?.run_id;
const rejoined = [];
for await (const part of client.runs.joinStream(thread.thread_id, runId, { lastEventId: "-1" })) {
  rejoined.push({ event: part.event, id: part.id ?? null });
}
const state = await client.threads.getState(thread.thread_id);
const run = await client.runs.get(thread.thread_id, runId);
console.log(JSON.stringify({ thread, created, streamed, rejoined, state, run }));
