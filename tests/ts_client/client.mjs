// Calls all four logstore tools through the official TypeScript MCP SDK over streamable HTTP with Basic
// auth, and prints one JSON object with what came back. Usage: node client.mjs URL SITE PASSWORD [DEPTH]
// With DEPTH, also appends and reads back an item nested exactly DEPTH levels deep, and tries DEPTH + 1.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, site, password, depthArg] = process.argv.slice(2);
const authorization = "Basic " + Buffer.from(`${site}:${password}`).toString("base64");
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: authorization } },
});
const client = new Client({ name: "logstore-ts-test", version: "1.0.0" });
await client.connect(transport);

const conversation_id = `ts-client-${Date.now()}`;
const call = async (name, args) => {
  const result = await client.callTool({ name, arguments: args });
  return { isError: result.isError ?? false, structuredContent: result.structuredContent, text: result.content[0].text };
};

const out = {
  protocolVersion: transport.protocolVersion ?? null,
  sessionId: transport.sessionId ?? null,
  tools: (await client.listTools()).tools,
  conversation_id,
  append: await call("append_memory", { conversation_id, items: [{ role: "user", text: "héllo" }, { n: 2 }] }),
  recall: await call("recall_memory", { conversation_id, count: 10 }),
  replay: await call("replay_memory", { conversation_id, offset: 1, limit: 5 }),
  list: await call("list_conversations", { limit: 1000 }),
  error: await call("append_memory", { conversation_id: "short", items: [{}] }),
};
if (depthArg) {
  // The item object is level 1; {"d": [[...]]} with DEPTH - 1 arrays.
  const nested = (depth) => ({ d: JSON.parse("[".repeat(depth - 1) + "]".repeat(depth - 1)) });
  const deep_id = `${conversation_id}-deep`;
  out.deep = {
    append: await call("append_memory", { conversation_id: deep_id, items: [nested(Number(depthArg))] }),
    recall: await call("recall_memory", { conversation_id: deep_id }),
    over: await call("append_memory", { conversation_id: deep_id, items: [{}, nested(Number(depthArg) + 1)] }),
  };
}
await transport.terminateSession();
await client.close();
process.stdout.write(JSON.stringify(out) + "\n");
