// Drives the Store with the JavaScript LangGraph SDK (@langchain/langgraph-sdk): put items, read
// one, search by prefix and filter, list namespaces, delete, and read the deleted one again (an
// error with its status). Prints one JSON object on stdout.
// Run by tests/test_agent_protocol_store.py (tests/support/js_sdk.py installs the SDK beside a copy).
import { Client } from "@langchain/langgraph-sdk";

const [apiUrl, apiKey] = process.argv.slice(2);
const client = new Client({ apiUrl, apiKey });

await client.store.putItem(["js", "notes"], "first", { text: "from node", rank: 1 });
await client.store.putItem(["js", "notes"], "second", { text: "also from node", rank: 2 });
const item = await client.store.getItem(["js", "notes"], "first");
const found = await client.store.searchItems(["js"], { filter: { rank: 2 }, limit: 5 });
const listed = await client.store.listNamespaces({ prefix: ["js"], maxDepth: 2 });
await client.store.deleteItem(["js", "notes"], "first");
let gone;
try {
  gone = { item: await client.store.getItem(["js", "notes"], "first") };
} catch (error) {
  gone = { status: error.status ?? null };
}
console.log(JSON.stringify({ item, found, listed, gone }));
