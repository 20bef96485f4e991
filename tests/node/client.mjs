// Drives `agents-sandbox mcp` with the official TypeScript MCP SDK client.
// Usage: node client.mjs BINARY CHECKOUT
// It lists the tools, compiles every advertised schema with a strict
// draft 2020-12 validator, creates the sandbox, runs a command with
// progress, cancels a long command and checks it is gone from the VM.
// It prints one JSON object on stdout and exits 0 on success.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

const [bin, checkout] = process.argv.slice(2);
if (!bin || !checkout) {
  console.error("usage: node client.mjs BINARY CHECKOUT");
  process.exit(2);
}

function fail(msg) {
  throw new Error(msg);
}

const report = { tools: [], progress: [], steps: [] };
const long = { timeout: 600000, resetTimeoutOnProgress: true };

const transport = new StdioClientTransport({
  command: bin,
  args: ["mcp", "--log-level", "debug"],
  env: process.env,
  stderr: "inherit",
});
const client = new Client({ name: "agents-sandbox-node-test", version: "0.0.0" });

async function call(name, args, options = {}) {
  const res = await client.callTool({ name, arguments: { checkout, ...args } }, undefined, { ...long, ...options });
  if (res.isError) fail(`${name}: ${res.content.map((c) => c.text).join("\n")}`);
  if (!res.structuredContent) fail(`${name}: no structured content`);
  return res.structuredContent;
}

// processes counts processes in the VM whose command line matches re.
async function processes(re) {
  const script = 'n=0; for f in /proc/[0-9]*/cmdline; do if tr "\\0" " " <"$f" 2>/dev/null | grep -q -- "$0"; then n=$((n+1)); fi; done; echo $n';
  const r = await call("sandbox_exec", { cmd: ["sh", "-c", script, re], user: "root" });
  return parseInt(r.stdout.text, 10);
}

async function waitUntil(cond, what) {
  const deadline = Date.now() + 60000;
  while (!(await cond())) {
    if (Date.now() > deadline) fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

try {
  await client.connect(transport);
  report.steps.push("connect");

  const { tools } = await client.listTools();
  const ajv = new Ajv2020({ strict: true, allErrors: true });
  addFormats(ajv);
  for (const t of tools) {
    for (const [kind, schema] of [["input", t.inputSchema], ["output", t.outputSchema]]) {
      if (!schema) fail(`${t.name}: no ${kind} schema`);
      try {
        ajv.compile(schema);
      } catch (e) {
        fail(`${t.name} ${kind} schema does not compile strictly: ${e.message}`);
      }
    }
    const a = t.annotations ?? {};
    for (const h of ["readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint"]) {
      if (typeof a[h] !== "boolean") fail(`${t.name}: annotation ${h} missing`);
    }
    report.tools.push(t.name);
  }
  report.steps.push("list");

  const created = await call("sandbox_create", { trust: true }, { onprogress: (p) => report.progress.push(p.message ?? "") });
  if (!created.vm) fail("create: no vm");
  report.vm = created.vm;
  report.steps.push("create");

  const msgs = [];
  const ex = await call(
    "sandbox_exec",
    { cmd: ["bash", "-c", "for i in 1 2 3; do echo node-line$i; done"] },
    { onprogress: (p) => msgs.push(p.message ?? "") },
  );
  if (ex.exit_code !== 0 || ex.stdout.text !== "node-line1\nnode-line2\nnode-line3\n") fail(`exec: ${JSON.stringify(ex)}`);
  report.execProgress = msgs;
  report.steps.push("exec");

  const ac = new AbortController();
  const pending = client
    .callTool({ name: "sandbox_exec", arguments: { checkout, cmd: ["sleep", "303"] } }, undefined, { ...long, signal: ac.signal })
    .then(
      () => "resolved",
      (e) => `rejected: ${e.message}`,
    );
  await waitUntil(async () => (await processes("[s]leep 303")) > 0, "the long command to start");
  ac.abort("test cancels");
  const outcome = await pending;
  if (!outcome.startsWith("rejected")) fail(`cancelled call ${outcome}`);
  await waitUntil(async () => (await processes("[s]leep 303")) === 0, "the cancelled command to be gone");
  report.steps.push("cancel");

  await client.close();
  process.stdout.write(JSON.stringify(report) + "\n");
  process.exit(0);
} catch (e) {
  process.stderr.write(`node client: ${e.stack ?? e}\n`);
  process.stdout.write(JSON.stringify({ ...report, error: String(e.message ?? e) }) + "\n");
  try {
    await client.close();
  } catch {}
  process.exit(1);
}
