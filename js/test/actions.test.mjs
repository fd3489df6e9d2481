// Cancel, Run again and Answer: one request per intended action, one Idempotency-Key until the server answered.
import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";

const { RunActions, UNREACHABLE, pageIntents } = await import("../src/actions.js");
// A second copy of the module, as the widget's bundle and the labextension's are on one page.
const other = await import("../src/actions.js?copy=widget");

const OLD = {
  run_id: "run_old", agent: "demo", status: "failed", session: "work/analysis.ipynb", metadata: { cell_id: "c1" },
  input: { prompt: "again" }, last_seq: 4, snapshot: {},
};

/**
 * A server that answers each request with what `answers` says next: a
 * Response, "down" (the network fails), or a promise the test settles.
 */
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

const created = (runId) => Response.json({ ...OLD, run_id: runId, status: "queued", retry_of: "run_old" }, { status: 201 });
const keys = (server) => server.requests.map((request) => request.headers["Idempotency-Key"]);

let intents;
beforeEach(() => {
  intents = new Map();
});

test("a double click on Run again sends one request with one key, and both clicks get its run", async () => {
  let reply;
  const server = fakeServer(new Promise((resolve) => (reply = resolve)));
  const actions = new RunActions({ baseUrl: "/", fetch: server.fetch, intents });
  const first = actions.runAgain(OLD);
  const second = actions.runAgain(OLD);
  reply(created("run_new"));
  const outcomes = await Promise.all([first, second]);
  assert.equal(server.requests.length, 1);
  const [posted] = server.requests;
  assert.equal(posted.url, "/api/agentruns/runs");
  assert.match(posted.headers["Idempotency-Key"], /^[0-9a-f]{32}$/);
  assert.deepEqual(posted.body, { agent: "demo", input: { prompt: "again" }, session: "work/analysis.ipynb", metadata: { cell_id: "c1" }, retry_of: "run_old" });
  assert.deepEqual(outcomes.map((outcome) => [outcome.run.run_id, outcome.problem]), [["run_new", null], ["run_new", null]]);
});

test("a retry after a network error sends the same key again", async () => {
  const server = fakeServer("down", created("run_new"));
  const actions = new RunActions({ baseUrl: "/", fetch: server.fetch, intents });
  assert.deepEqual(await actions.runAgain(OLD), { run: null, problem: UNREACHABLE });
  const outcome = await actions.runAgain(OLD);
  assert.equal(outcome.run.run_id, "run_new");
  const [first, second] = keys(server);
  assert.equal(first, second);
});

test("another copy of the module on the page retries with the same key", async () => {
  const server = fakeServer("down", created("run_new"));
  assert.notEqual(other.RunActions, RunActions);
  const notebook = new other.RunActions({ baseUrl: "/", fetch: server.fetch });
  const panel = new RunActions({ baseUrl: "/", fetch: server.fetch });
  await notebook.runAgain(OLD);
  await panel.runAgain(OLD);
  const [first, second] = keys(server);
  assert.equal(first, second);
  assert.equal(notebook.intents, pageIntents(), "one table of actions for the page");
  assert.equal(pageIntents().size, 0, "answered: nothing is kept");
});

test("after the server answered, a new click is a new action with a new key", async () => {
  const server = fakeServer(created("run_one"), Response.json({ error: "agent_not_found", message: "no agent demo" }, { status: 404 }), created("run_two"));
  const actions = new RunActions({ baseUrl: "/", fetch: server.fetch, intents });
  assert.equal((await actions.runAgain(OLD)).run.run_id, "run_one");
  assert.deepEqual(await actions.runAgain(OLD), { run: null, problem: "no agent demo" });
  assert.equal((await actions.runAgain(OLD)).run.run_id, "run_two");
  const sent = keys(server);
  assert.equal(new Set(sent).size, 3, "each answered click had a key of its own");
  assert.equal(intents.size, 0);
});

test("Run again of another run is another action", async () => {
  const server = fakeServer("down", created("run_new"));
  const actions = new RunActions({ baseUrl: "/", fetch: server.fetch, intents });
  await actions.runAgain(OLD);
  await actions.runAgain({ ...OLD, run_id: "run_other" });
  const [first, second] = keys(server);
  assert.notEqual(first, second);
  assert.equal(server.requests[1].body.retry_of, "run_other");
});

test("a double click on Cancel sends one request; the server's refusal is the outcome's problem", async () => {
  let reply;
  const server = fakeServer(new Promise((resolve) => (reply = resolve)));
  const actions = new RunActions({ baseUrl: "/base", fetch: server.fetch, intents });
  const clicks = [actions.cancel("run_a", "cancelled from the runs panel"), actions.cancel("run_a", "cancelled from the runs panel")];
  reply(Response.json({ error: "run_not_found", message: "run run_a was not found" }, { status: 404 }));
  for (const outcome of await Promise.all(clicks)) assert.deepEqual(outcome, { run: null, problem: "run run_a was not found" });
  assert.equal(server.requests.length, 1);
  assert.equal(server.requests[0].url, "/base/api/agentruns/runs/run_a/cancel");
  assert.deepEqual(server.requests[0].body, { reason: "cancelled from the runs panel" });
  assert.equal(server.requests[0].headers["Idempotency-Key"], undefined, "a cancel is idempotent on the server: no key");
});

test("Cancel gives the run as the server answered, and says when the server cannot be reached", async () => {
  const server = fakeServer("down", Response.json({ ...OLD, status: "cancelling" }, { status: 202 }));
  const actions = new RunActions({ baseUrl: "/", fetch: server.fetch, intents });
  assert.deepEqual(await actions.cancel("run_old", "enough"), { run: null, problem: "cannot reach the server." });
  assert.equal((await actions.cancel("run_old", "enough")).run.status, "cancelling");
});

test("an answer posts the choice (and the note, when there is one); a refusal is the outcome's problem", async () => {
  const server = fakeServer(
    Response.json({ error: "invalid_choice", message: "maybe is not offered" }, { status: 400 }),
    "down",
    Response.json({ ...OLD, status: "running" }),
  );
  const actions = new RunActions({ baseUrl: "/", fetch: server.fetch, intents });
  assert.deepEqual(await actions.answer("run_a", "q/1", "maybe"), { run: null, problem: "maybe is not offered" });
  assert.deepEqual(await actions.answer("run_a", "q/1", "approve", "ship it"), { run: null, problem: UNREACHABLE });
  assert.equal((await actions.answer("run_a", "q/1", "approve", "ship it")).run.status, "running");
  assert.equal(server.requests[0].url, "/api/agentruns/runs/run_a/inputs/q%2F1");
  assert.deepEqual(server.requests.map((request) => request.body), [{ choice: "maybe" }, { choice: "approve", note: "ship it" }, { choice: "approve", note: "ship it" }]);
});

test("a double click on an answer sends it once", async () => {
  let reply;
  const server = fakeServer(new Promise((resolve) => (reply = resolve)));
  const actions = new RunActions({ baseUrl: "/", fetch: server.fetch, intents });
  const clicks = [actions.answer("run_a", "q1", "approve"), actions.answer("run_a", "q1", "approve")];
  reply(Response.json({ ...OLD, status: "running" }));
  await Promise.all(clicks);
  assert.equal(server.requests.length, 1);
});

test("a double click on Undo sends one request; the server's 409 says in words why the edit stays", async () => {
  let reply;
  const server = fakeServer(new Promise((resolve) => (reply = resolve)), Response.json({ ...OLD, status: "succeeded" }));
  const actions = new RunActions({ baseUrl: "/base/", fetch: server.fetch, intents });
  const clicks = [actions.undo("run_a", "edit/1"), actions.undo("run_a", "edit/1")];
  reply(Response.json({ error: "edit_conflict", message: "cell c2 changed since the agent edited it" }, { status: 409 }));
  for (const outcome of await Promise.all(clicks)) assert.deepEqual(outcome, { run: null, problem: "cell c2 changed since the agent edited it" });
  assert.equal(server.requests.length, 1);
  assert.equal(server.requests[0].url, "/base/api/agentruns/runs/run_a/edits/edit%2F1/undo");
  assert.equal(server.requests[0].method, "POST");
  // Answered: a click after the cell was put back is a new try.
  assert.equal((await actions.undo("run_a", "edit/1")).run.status, "succeeded");
  assert.equal(server.requests.length, 2);
  assert.equal(intents.size, 0);
});
