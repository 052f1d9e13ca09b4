// Drives the rest of the Agent Protocol with the JavaScript LangGraph SDK
// (@langchain/langgraph-sdk): a run without a thread (runs.wait(null, ...)), a run streamed in
// messages-tuple and updates, threads.updateState as a node, the thread's stream
// (threads.joinStream) taken up after a part of that run and following the next run, and crons
// created, counted and deleted. Prints one JSON object on stdout.
// Run by tests/test_agent_protocol_rest.py (tests/support/js_sdk.py installs the SDK beside a copy).
import { Client } from "@langchain/langgraph-sdk";

const [apiUrl, tag] = process.argv.slice(2);
const client = new Client({ apiUrl });
const said = (content) => ({ messages: [{ role: "user", content }] });

const stateless = await client.runs.wait(null, "agent", { input: said("no thread") });

const thread = await client.threads.create();
const threadId = thread.thread_id;
const created = [];
const streamed = [];
for await (const part of client.runs.stream(threadId, "agent", {
  input: said("greet me"), streamMode: ["messages-tuple", "updates"], streamResumable: true,
  onRunCreated: (run) => created.push(run),
})) {
  streamed.push({ event: part.event, data: part.data, id: part.id ?? null });
}
const runId = created[0].run_id;

const before = await client.threads.getState(threadId);
const answer = before.values.messages.at(-1);
const updated = await client.threads.updateState(threadId, {
  values: { messages: [{ id: answer.id, role: "assistant", content: "Hello world." }] }, asNode: "agent",
});
const state = await client.threads.getState(threadId);

// The thread's stream from the run's first part after metadata: the rest of that run, then the
// run made once it ended, to that one's end.
const joined = [];
let next = null;
const leave = new AbortController();
for await (const part of client.threads.joinStream(threadId, {
  lastEventId: `${runId}:${streamed[1].id}`, signal: leave.signal,
})) {
  joined.push({ event: part.event, data: part.data, id: part.id ?? null });
  if (part.event !== "end") continue;
  if (next !== null) break;
  next = await client.runs.create(threadId, "agent", { input: said("and?") });
}
leave.abort();

const forThread = await client.crons.createForThread(threadId, "agent", {
  schedule: "0 9 * * *", input: said("good morning"), metadata: { tag },
});
const alone = await client.crons.create("agent", { schedule: "0 9 * * *", input: said("hi"), metadata: { tag } });
const counted = { tagged: await client.crons.count({ metadata: { tag } }),
                  thread: await client.crons.count({ threadId }) };
const found = await client.crons.search({ threadId });
await client.crons.delete(forThread.cron_id);
await client.crons.delete(alone.cron_id);
const left = await client.crons.count({ metadata: { tag } });
console.log(JSON.stringify({
  stateless, thread, created, streamed, before, updated, state, joined, next,
  crons: { forThread, alone, counted, found, left },
}));
