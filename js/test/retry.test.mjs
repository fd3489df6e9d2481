// Retry from here: the step's event found in the run's log, the fork sent once, with the prompt as edited.
import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";

import { installPage, until } from "./dom.mjs";

installPage();
const { RunActions } = await import("../src/actions.js");
const { retryForm, stepSeq } = await import("../src/retry.js");

const EVENTS = [
  { seq: 1, type: "run.started" },
  { seq: 2, type: "tool.started" },
  { seq: 3, type: "tool.completed" },
  { seq: 4, type: "message.started" },
  { seq: 5, type: "tool.started" },
  { seq: 6, type: "tool.completed" },
  { seq: 7, type: "run.succeeded" },
];

/** A server holding EVENTS (answered two a page), then answering forks with `forkAnswers`. */
function fakeServer(...forkAnswers) {
  const server = { requests: [] };
  server.fetch = async (url, init = {}) => {
    server.requests.push({ url, method: init.method || "GET", headers: init.headers || {}, body: init.body });
    const events = url.match(/\/events\?after=(\d+)/);
    if (events) {
      const after = Number(events[1]);
      const page = EVENTS.filter((event) => event.seq > after).slice(0, 2);
      return Response.json({ events: page, done: page.length === 0 || page[page.length - 1].seq === 7 });
    }
    return forkAnswers.shift() ?? Response.json({ error: "unexpected", message: "no answer left" }, { status: 500 });
  };
  return server;
}

let intents;
beforeEach(() => {
  intents = new Map();
});

test("a step's seq is its tool.started's, read page after page; a step not in the log is null", async () => {
  const server = fakeServer();
  assert.equal(await stepSeq("/", "run_a", 0, server.fetch), 2);
  assert.equal(await stepSeq("/", "run_a", 1, server.fetch), 5);
  assert.equal(await stepSeq("/", "run_a", 2, server.fetch), null);
  assert.ok(server.requests.every((request) => request.url.startsWith("/api/agentruns/runs/run_a/events?after=")));
});

function form(server, input, started = () => {}) {
  const actions = new RunActions({ baseUrl: "/", fetch: server.fetch, intents });
  const node = retryForm({ runId: "run_a", index: 1, input, baseUrl: "/", actions, started, close: () => {}, fetch: server.fetch });
  document.body.appendChild(node);
  return node;
}

test("Retry forks from the event before the step, with the edited prompt, once", async () => {
  const server = fakeServer(Response.json({ run_id: "run_fork", status: "queued" }, { status: 201 }));
  const started = [];
  const node = form(server, { prompt: "What is 2 + 3?", model: "m" }, (run) => started.push(run.run_id));
  const text = node.querySelector(".agentruns-retry-prompt");
  assert.equal(text.value, "What is 2 + 3?");
  assert.equal(text.hidden, false);
  text.value = "And 20 + 30?";
  node.querySelector(".agentruns-retry-go").click();
  await until(() => started.length === 1);
  const forks = server.requests.filter((request) => request.method === "POST");
  assert.equal(forks.length, 1);
  assert.equal(forks[0].url, "/api/agentruns/runs/run_a/fork");
  assert.deepEqual(forks[0].body, { at_seq: 4, input: { prompt: "And 20 + 30?" } });
  assert.match(forks[0].headers["Idempotency-Key"], /^[0-9a-f]{32}$/);
  assert.equal(node.querySelector(".agentruns-retry-note").textContent, "Started run_fork");
});

test("an unchanged prompt sends no input fields; without a prompt the box is hidden; a refusal is said", async () => {
  const refusal = Response.json(
    { error: "fork_unsupported", message: "The run run_a cannot be forked: no fork()." },
    { status: 422 }
  );
  const server = fakeServer(refusal);
  const node = form(server, { messages: [] });
  assert.equal(node.querySelector(".agentruns-retry-prompt").hidden, true);
  node.querySelector(".agentruns-retry-go").click();
  const note = node.querySelector(".agentruns-retry-note");
  await until(() => note.textContent.startsWith("Retry failed"));
  assert.equal(note.textContent, "Retry failed: The run run_a cannot be forked: no fork().");
  const [fork] = server.requests.filter((request) => request.method === "POST");
  assert.deepEqual(fork.body, { at_seq: 4, input: {} });
});
