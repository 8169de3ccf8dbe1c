// An independent MCP client for tests/test_mcp_interop.py: the official TypeScript SDK.
//
//   node mcp_client.mjs URL '[{"name": "echo", "arguments": {"text": "hi"}}, ...]'
//
// Connects over streamable HTTP, lists the tools, makes each call in order and prints one JSON
// document: {"server", "protocolVersion", "tools", "results"}. A call the server answers with
// isError is an ordinary result; a call that fails at the protocol level is {"error": message}.
// A failure to connect or list prints {"error": message} and exits 1.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, callsJson = "[]"] = process.argv.slice(2);
if (!url) {
  console.error("usage: node mcp_client.mjs URL [JSON list of {name, arguments}]");
  process.exit(2);
}
const calls = JSON.parse(callsJson);

const client = new Client({ name: "aenv-ray-interop-ts", version: "0.0.0" });
const transport = new StreamableHTTPClientTransport(new URL(url));
try {
  await client.connect(transport);
  const listed = await client.listTools();
  const results = [];
  for (const call of calls) {
    try {
      results.push(await client.callTool({ name: call.name, arguments: call.arguments ?? {} }));
    } catch (error) {
      results.push({ error: String(error?.message ?? error) });
    }
  }
  console.log(
    JSON.stringify({
      server: client.getServerVersion() ?? null,
      protocolVersion: transport.protocolVersion ?? null,
      tools: listed.tools,
      results,
    }),
  );
} catch (error) {
  console.log(JSON.stringify({ error: String(error?.message ?? error) }));
  process.exitCode = 1;
} finally {
  await client.close();
}
