// What needs the person: the watch over the caller's runs, with a fake server and a fake hub.
import assert from "node:assert/strict";
import { test } from "node:test";

import { installPage } from "./dom.mjs";

installPage();
const { RunWatch, WATCH_LIMIT, LONG_RUN_MS, endedToast, countRuns, countWords, endedWords, questionChoices, questionWords, runDuration } = await import(
  "../src/attention.js"
);
const { RunState } = await import("../src/runstate.js");

const TS = "2026-01-01T00:09:00.000Z";

function runObject(runId, fields = {}) {
  return {
    run_id: runId, agent: "demo", status: "running", session: "work/analysis.ipynb", metadata: {},
    input: { prompt: `about ${runId}` }, retry_of: null, created_at: "2026-01-01T00:07:00.000Z",
    started_at: "2026-01-01T00:07:00.000Z", finished_at: null, last_seq: 2, first_seq: 1,
    snapshot: { messages: [], tools: [], progress: null, usage: null, inputs: [] },
    output: null, error: null, cancel: null,
    ...fields,
  };
}

const QUESTION = { request_id: "q1", kind: "approval", title: "Write the answer?", details: null, choices: ["approve", "deny"] };

function fakeServer(runs) {
  const server = { runs, requests: [] };
  server.fetch = async (url, init = {}) => {
    const parsed = new URL(url, "http://localhost");
    server.requests.push({ path: parsed.pathname, query: parsed.searchParams, method: init.method || "GET", body: init.body || null });
    if ((init.method || "GET") === "GET" && parsed.pathname === "/api/agentruns/runs") {
      return Response.json({ runs: server.runs.slice(0, Number(parsed.searchParams.get("limit"))), next: null });
    }
    if (init.method === "POST" && /\/inputs\/q1$/.test(parsed.pathname)) {
      if (init.body.choice === "maybe") return Response.json({ error: "invalid_choice", message: "maybe is not offered" }, { status: 400 });
      return Response.json({}, { status: 200 });
    }
    return Response.json({ error: "run_not_found", message: "no such run" }, { status: 404 });
  };
  return server;
}

function fakeHub() {
  const hub = { listeners: new Map(), cursors: new Map() };
  hub.register = (runId, cursor, listener) => {
    hub.listeners.set(runId, listener);
    hub.cursors.set(runId, cursor);
    return () => hub.listeners.delete(runId);
  };
  return hub;
}

function watchOf(server, hub) {
  const watch = new RunWatch({ baseUrl: "/", hub, fetch: server.fetch, setInterval: () => 1, clearInterval: () => {} });
  const heard = [];
  watch.listen({
    onCounts: (counts) => heard.push(["counts", counts]),
    onQuestion: (run, input) => heard.push(["question", run.run_id, input.request_id]),
    onResolved: (runId, requestId) => heard.push(["resolved", runId, requestId]),
    onEnded: (run, state, duration) => heard.push(["ended", run.run_id, state.status, duration]),
  });
  return { watch, heard };
}

test("one look counts the active runs and follows them on the page's one stream", async () => {
  const server = fakeServer([
    runObject("run_a"),
    runObject("run_b", { status: "waiting", snapshot: { messages: [], tools: [], inputs: [{ ...QUESTION, status: "open", choice: null }] } }),
    runObject("run_done", { status: "succeeded", finished_at: TS }),
  ]);
  const hub = fakeHub();
  const { watch, heard } = watchOf(server, hub);
  await watch.poll();
  assert.equal(server.requests[0].query.get("limit"), String(WATCH_LIMIT));
  assert.deepEqual(watch.counts, { running: 1, waiting: 1 });
  assert.deepEqual([...hub.listeners.keys()].sort(), ["run_a", "run_b"]); // a finished run is no news
  assert.equal(hub.cursors.get("run_a"), 2);
  assert.deepEqual(heard, [["question", "run_b", "q1"], ["counts", { running: 1, waiting: 1 }]]);
});

test("a question asked on the stream is told once, its answer dismisses it, and the end is told with its duration", async () => {
  const server = fakeServer([runObject("run_a")]);
  const hub = fakeHub();
  const { watch, heard } = watchOf(server, hub);
  await watch.poll();
  heard.length = 0;
  const listener = hub.listeners.get("run_a");
  const event = (seq, type, data, ts = TS) => listener.onEvent({ run_id: "run_a", seq, type, ts, data });
  event(3, "input.requested", QUESTION);
  assert.deepEqual(heard, [["question", "run_a", "q1"], ["counts", { running: 0, waiting: 1 }]]);
  await watch.poll(); // the list says the same: nothing new
  assert.equal(heard.length, 2);
  event(4, "input.resolved", { request_id: "q1", choice: "approve", note: null, by: null });
  assert.deepEqual(heard.slice(2), [["resolved", "run_a", "q1"], ["counts", { running: 1, waiting: 0 }]]);
  event(5, "run.failed", { error: { type: "boom", message: "it broke" } }, "2026-01-01T00:09:00.000Z");
  assert.deepEqual(heard.slice(4), [["ended", "run_a", "failed", 120_000], ["counts", { running: 0, waiting: 0 }]]);
  assert.equal(hub.listeners.has("run_a"), false);
  assert.equal(watch.runs.size, 0);
});

test("a run the list shows ended is told ended; an unknown run on the stream is dropped", async () => {
  const server = fakeServer([runObject("run_a"), runObject("run_gone")]);
  const hub = fakeHub();
  const { watch, heard } = watchOf(server, hub);
  await watch.poll();
  server.runs = [runObject("run_a", { status: "cancelled", last_seq: 5, finished_at: "2026-01-01T00:07:30.000Z" })];
  hub.listeners.get("run_gone").onError({ run_id: "run_gone", error: { error: "run_not_found" } });
  await watch.poll();
  assert.deepEqual(heard.slice(1), [["counts", { running: 1, waiting: 0 }], ["ended", "run_a", "cancelled", 30_000], ["counts", { running: 0, waiting: 0 }]]);
});

test("answering posts the choice and says what went wrong when it was not taken", async () => {
  const server = fakeServer([]);
  const { watch } = watchOf(server, fakeHub());
  assert.equal(await watch.answer("run_a", "q1", "approve"), null);
  const posted = server.requests.at(-1);
  assert.equal(posted.path, "/api/agentruns/runs/run_a/inputs/q1");
  assert.deepEqual(posted.body, { choice: "approve" });
  assert.match(await watch.answer("run_a", "q1", "maybe"), /maybe is not offered/);
});

test("a hidden page is not polled", async () => {
  const server = fakeServer([]);
  let tick = null;
  let hidden = true;
  const watch = new RunWatch({ baseUrl: "/", hub: fakeHub(), fetch: server.fetch, setInterval: (fn) => (tick = fn), clearInterval: () => {}, hidden: () => hidden });
  watch.start();
  await watch.pending;
  tick();
  assert.equal(server.requests.length, 1);
  hidden = false;
  tick();
  await watch.pending;
  assert.equal(server.requests.length, 2);
  watch.dispose();
});

test("the words of the toasts and the status bar", () => {
  const run = runObject("run_a", { session: "work/analysis.ipynb", input: { prompt: "weather in Shanghai" } });
  assert.equal(questionWords(run, QUESTION), "A run asks: Write the answer? (weather in Shanghai, analysis.ipynb)");
  assert.equal(questionWords({ ...run, session: null }, QUESTION), "A run asks: Write the answer? (weather in Shanghai)");
  assert.deepEqual(questionChoices(QUESTION), [["approve", "approve"], ["deny", "deny"]]);
  const failed = new RunState("run_a");
  failed.loadRun(runObject("run_a", { status: "failed", error: { type: "x", message: "it broke" }, finished_at: TS }));
  assert.equal(endedWords(run, failed, 1000), "Run failed: weather in Shanghai (analysis.ipynb): it broke");
  const done = new RunState("run_a");
  done.loadRun(runObject("run_a", { status: "succeeded", finished_at: "2026-01-01T00:09:05.000Z" }));
  assert.equal(runDuration(done), 125_000);
  assert.equal(endedWords(run, done, runDuration(done)), "Run finished after 2 min 5 s: weather in Shanghai (analysis.ipynb)");
  assert.deepEqual(countRuns([done, failed]), { running: 0, waiting: 0 });
  assert.equal(countWords({ running: 2, waiting: 1 }), "2 running · 1 waiting");
  assert.equal(countWords({ running: 0, waiting: 1 }), "1 waiting");
  assert.equal(countWords({ running: 0, waiting: 0 }), "");
});

test("a run that started and ended between two looks is told; one the first look found ended is not", async () => {
  const server = fakeServer([runObject("run_old", { status: "failed", finished_at: TS })]);
  const { watch, heard } = watchOf(server, fakeHub());
  await watch.poll();
  assert.deepEqual(heard, []);
  server.runs = [runObject("run_quick", { status: "failed", error: { type: "x", message: "no" }, finished_at: TS }), ...server.runs];
  await watch.poll();
  assert.deepEqual(heard, [["ended", "run_quick", "failed", 120_000]]);
  await watch.poll();
  assert.equal(heard.length, 1);
});

test("a failure is toasted, a long run's end too, unless its setting is off or its notebook is in view", () => {
  const on = { notifyFailures: true, notifyLongRuns: true };
  const state = (status) => Object.assign(new RunState("run_a"), { status });
  assert.equal(endedToast(state("failed"), 1000, on, false), "error");
  assert.equal(endedToast(state("failed"), 1000, { ...on, notifyFailures: false }, false), null);
  assert.equal(endedToast(state("failed"), 1000, on, true), null);
  assert.equal(endedToast(state("succeeded"), LONG_RUN_MS - 1, on, false), null);
  assert.equal(endedToast(state("succeeded"), LONG_RUN_MS, on, false), "success");
  assert.equal(endedToast(state("cancelled"), LONG_RUN_MS * 3, on, false), "info");
  assert.equal(endedToast(state("succeeded"), LONG_RUN_MS, { ...on, notifyLongRuns: false }, false), null);
  assert.equal(endedToast(state("succeeded"), LONG_RUN_MS, on, true), null);
  assert.equal(endedToast(state("succeeded"), null, on, false), null);
});
