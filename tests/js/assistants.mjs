// Drives assistants with the JavaScript LangGraph SDK (@langchain/langgraph-sdk): create one with
// a system prompt, update it (a new version), list its versions, search (with the next page) and
// count by a tag, run a thread with it, set its first version back as the latest, delete it and
// read it again (an error with its status). Prints one JSON object on stdout.
// Run by tests/test_agent_protocol_assistants.py (tests/support/js_sdk.py installs the SDK beside a copy).
import { Client } from "@langchain/langgraph-sdk";

const [apiUrl, tag, message] = process.argv.slice(2);
const client = new Client({ apiUrl });

const created = await client.assistants.create({
  graphId: "agent", name: "JS Pirate", metadata: { tag, tier: 1 },
  context: { system_prompt: "You are a terse JS pirate.", model: "test-model" },
});
const id = created.assistant_id;
const updated = await client.assistants.update(id, {
  context: { system_prompt: "You are a polite JS pirate." }, metadata: { tier: 2 },
});
const versions = await client.assistants.getVersions(id);
const other = await client.assistants.create({ graphId: "agent", name: "JS Other", metadata: { tag } });
const page = await client.assistants.search({
  metadata: { tag }, sortBy: "name", sortOrder: "asc", limit: 1, includePagination: true,
});
const byName = await client.assistants.search({ name: "js pir" });
const counted = { tagged: await client.assistants.count({ metadata: { tag } }),
                  tier2: await client.assistants.count({ metadata: { tag, tier: 2 } }) };
const thread = await client.threads.create();
const values = await client.runs.wait(thread.thread_id, id, {
  input: { messages: [{ role: "user", content: message }] },
});
const runs = await client.runs.list(thread.thread_id);
const latest = await client.assistants.setLatest(id, 1);
await client.assistants.delete(other.assistant_id);
await client.assistants.delete(id);
let gone;
try {
  gone = { assistant: await client.assistants.get(id) };
} catch (error) {
  gone = { status: error.status ?? null };
}
const left = await client.assistants.count({ metadata: { tag } });
console.log(JSON.stringify({ created, updated, versions, page, byName, counted, values, runs, latest, gone, left }));
