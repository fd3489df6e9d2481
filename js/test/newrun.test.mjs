// New run: the form's checks, its one request per intended start, and what it opens.
import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";
import { installPage, until } from "./dom.mjs";

installPage();
const { NewRunForm, newRunBody, notebookPath } = await import("../src/newrun.js");
const { RunActions } = await import("../src/actions.js");

const AGENTS = { agents: [{ name: "demo", description: "no model" }, { name: "opencode" }], default_agent: "opencode" };

function fakeServer(...answers) {
  const server = { requests: [] };
  server.fetch = async (url, init = {}) => {
    server.requests.push({ url, method: init.method || "GET", headers: init.headers || {}, body: init.body });
    const answer = await (answers.shift() ?? Response.json({ error: "unexpected", message: "no answer left" }, { status: 500 }));
    if (answer === "down") throw new TypeError("network down");
    return answer;
  };
  return server;
}

let opened;
function form(server) {
  opened = [];
  const actions = new RunActions({ baseUrl: "/", fetch: server.fetch, intents: new Map() });
  return new NewRunForm({ baseUrl: "/", fetch: server.fetch, actions, openRun: (runId) => opened.push(runId) });
}

beforeEach(() => installPage());

test("a notebook path is one under the server's root, or nothing", () => {
  assert.equal(notebookPath("  work/a.ipynb "), "work/a.ipynb");
  assert.equal(notebookPath("./a.ipynb"), "a.ipynb");
  assert.equal(notebookPath(""), undefined);
  for (const bad of ["/etc/passwd", "../a.ipynb", "a//b.ipynb", "a/./b.ipynb"]) assert.equal(notebookPath(bad), null, bad);
});

test("the body says the agent and prompt, and with a notebook its conversation", () => {
  assert.deepEqual(newRunBody({ agent: "demo", prompt: "hi", notebook: "" }).body, { agent: "demo", input: { prompt: "hi" } });
  assert.deepEqual(newRunBody({ agent: "demo", prompt: "hi", notebook: "w/a.ipynb" }).body, {
    agent: "demo", input: { prompt: "hi" }, session: "w/a.ipynb", metadata: { notebook: "w/a.ipynb" },
  });
  assert.match(newRunBody({ agent: "demo", prompt: "  ", notebook: "" }).problem, /Write what the agent should do/);
  assert.match(newRunBody({ agent: "", prompt: "hi", notebook: "" }).problem, /Choose an agent/);
  assert.match(newRunBody({ agent: "demo", prompt: "hi", notebook: "../x" }).problem, /not a notebook's path/);
});

test("open lists the agents with the server's default chosen; Enter starts one run and opens it", async () => {
  let reply;
  const server = fakeServer(Response.json(AGENTS), new Promise((resolve) => (reply = resolve)));
  const newRun = form(server);
  await newRun.open();
  assert.equal(newRun.node.hidden, false);
  assert.deepEqual([...newRun.agent.options].map((option) => option.value), ["demo", "opencode"]);
  assert.equal(newRun.agent.value, "opencode");
  newRun.prompt.value = "what is in df?";
  const enter = () => newRun.prompt.dispatchEvent(new window.KeyboardEvent("keydown", { key: "Enter", bubbles: true }));
  enter();
  enter(); // a second press while the first is under way starts nothing more
  reply(Response.json({ run_id: "run_new", status: "queued" }, { status: 201 }));
  await until(() => opened.length === 1);
  const posts = server.requests.filter((request) => request.method === "POST");
  assert.equal(posts.length, 1);
  assert.deepEqual(posts[0].body, { agent: "opencode", input: { prompt: "what is in df?" } });
  assert.match(posts[0].headers["Idempotency-Key"], /^[0-9a-f]{32}$/);
  assert.deepEqual(opened, ["run_new"]);
  assert.equal(newRun.node.hidden, true);
  assert.equal(newRun.prompt.value, "");
});

test("Shift+Enter is a new line, not a start", async () => {
  const server = fakeServer(Response.json(AGENTS));
  const newRun = form(server);
  await newRun.open();
  newRun.prompt.value = "first line";
  const event = new window.KeyboardEvent("keydown", { key: "Enter", shiftKey: true, bubbles: true, cancelable: true });
  newRun.prompt.dispatchEvent(event);
  assert.equal(event.defaultPrevented, false);
  assert.equal(server.requests.filter((request) => request.method === "POST").length, 0);
});

test("a refusal is said and the form stays; a retry after a network error sends the same key", async () => {
  const server = fakeServer(
    Response.json(AGENTS),
    Response.json({ error: "invalid_input", message: "input: 'prompt' is too long" }, { status: 400 }),
    "down",
    Response.json({ run_id: "run_ok", status: "queued" }, { status: 201 }),
  );
  const newRun = form(server);
  await newRun.open();
  newRun.prompt.value = "x";
  await newRun.start();
  assert.equal(newRun.message.textContent, "Not started: input: 'prompt' is too long");
  assert.equal(newRun.node.hidden, false);
  await newRun.start();
  assert.equal(newRun.message.textContent, "Not started: cannot reach the server.");
  await newRun.start();
  assert.deepEqual(opened, ["run_ok"]);
  const [, second, third] = server.requests.filter((request) => request.method === "POST").map((request) => request.headers["Idempotency-Key"]);
  assert.equal(second, third, "the retry after the network error is the same start");
});

test("bad input is said and nothing is sent", async () => {
  const server = fakeServer(Response.json(AGENTS));
  const newRun = form(server);
  await newRun.open();
  newRun.prompt.value = "hello";
  newRun.notebook.value = "../../secret.ipynb";
  await newRun.start();
  assert.match(newRun.message.textContent, /not a notebook's path/);
  assert.equal(server.requests.length, 1);
});
