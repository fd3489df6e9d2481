// The runs panel, with a fake server and a fake hub.
import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";

import { installPage, sleep, until } from "./dom.mjs";

installPage();
const { RunsPanel, PAGE_SIZE, baseName, contentsPath, describeTokens } = await import("../src/panel.js");
const { timingWords } = await import("../src/words.js");
const { RunState } = await import("../src/runstate.js");

const NOW = Date.parse("2026-01-01T00:10:00.000Z");
const TS = "2026-01-01T00:09:00.000Z";

function runObject(runId, fields = {}) {
  return {
    run_id: runId, agent: "demo", status: "running", session: "work/analysis.ipynb", metadata: {},
    input: { prompt: runId }, retry_of: null, created_at: "2026-01-01T00:07:00.000Z",
    started_at: "2026-01-01T00:07:01.000Z", finished_at: null, last_seq: 2, first_seq: 1,
    snapshot: { messages: [], tools: [], progress: null, usage: null, inputs: [] },
    output: null, error: null, cancel: null,
    ...fields,
  };
}

/** A server with a list of runs (newest first), answering the panel's requests and recording them. */
function fakeServer(runs) {
  const server = { runs, requests: [], posted: [] };
  globalThis.fetch = async (url, init = {}) => {
    const parsed = new URL(url, "http://localhost");
    const request = { path: parsed.pathname, query: parsed.searchParams, method: init.method || "GET", headers: init.headers || {}, body: init.body ? JSON.parse(init.body) : null };
    server.requests.push(request);
    if (request.method === "GET" && request.path === "/api/agentruns/runs") {
      let listed = server.runs;
      const status = parsed.searchParams.get("status");
      const session = parsed.searchParams.get("session");
      if (status) listed = listed.filter((run) => run.status === status);
      if (session) listed = listed.filter((run) => run.session === session);
      const before = parsed.searchParams.get("before");
      if (before) listed = listed.slice(listed.findIndex((run) => run.run_id === before) + 1);
      const limit = Number(parsed.searchParams.get("limit"));
      const page = listed.slice(0, limit);
      const next = listed.length > limit ? page[page.length - 1].run_id : null;
      return Response.json({ runs: page, next });
    }
    if (request.method === "POST") {
      server.posted.push(request);
      const cancel = request.path.match(/^\/api\/agentruns\/runs\/([^/]+)\/cancel$/);
      if (cancel) {
        const run = server.runs.find((item) => item.run_id === cancel[1]);
        run.status = "cancelling";
        run.last_seq += 1;
        return Response.json(run, { status: 202 });
      }
      if (request.path === "/api/agentruns/runs") {
        const made = runObject(`run_new${server.runs.length}`, { ...request.body, status: "queued", started_at: null, last_seq: 0 });
        server.runs.unshift(made);
        return Response.json(made, { status: 201 });
      }
      if (/\/inputs\//.test(request.path)) return Response.json({}, { status: 200 });
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

function makePanel(hub, options = {}) {
  const timers = [];
  const panel = new RunsPanel({
    baseUrl: "/",
    hub,
    openPath: () => {},
    now: () => NOW,
    setInterval: (fn, ms) => timers.push({ fn, ms }),
    clearInterval: () => {},
    ...options,
  });
  document.body.replaceChildren(panel.node);
  return { panel, timers };
}

const rows = (panel) => Array.from(panel.node.querySelectorAll(".agentruns-panel-run"));
const text = (row, selector) => row.querySelector(selector).textContent;

beforeEach(() => installPage());

test("the caller's runs are listed newest first, with status, agent, notebook, age and duration", async () => {
  fakeServer([
    runObject("run_b", { agent: "openai", snapshot: { messages: [], tools: [], progress: null, usage: { input_tokens: 1200, output_tokens: 34, cost: 0.0123 }, inputs: [] } }),
    runObject("run_a", { status: "succeeded", session: null, finished_at: "2026-01-01T00:07:13.500Z" }),
  ]);
  const { panel, timers } = makePanel(fakeHub());
  panel.show();
  await until(() => rows(panel).length === 2);
  const [b, a] = rows(panel);
  assert.equal(b.dataset.runId, "run_b");
  assert.equal(text(b, ".agentruns-chip"), "running");
  assert.equal(text(b, ".agentruns-panel-agent"), "openai");
  assert.equal(text(b, ".agentruns-panel-notebook"), "analysis.ipynb");
  assert.equal(b.querySelector(".agentruns-panel-notebook").title, "Open work/analysis.ipynb");
  assert.equal(text(b, ".agentruns-panel-age"), "3 min ago");
  assert.equal(text(b, ".agentruns-panel-timing"), "running for 2 min 59 s");
  assert.equal(text(b, ".agentruns-panel-tokens"), "1,234 tokens · cost 0.01");
  assert.equal(b.querySelector(".agentruns-cancel").hidden, false);
  assert.equal(b.querySelector(".agentruns-again").hidden, true);
  assert.equal(a.dataset.status, "succeeded");
  assert.equal(text(a, ".agentruns-panel-notebook"), "no notebook");
  assert.equal(text(a, ".agentruns-panel-timing"), "took 12 s");
  assert.equal(a.querySelector(".agentruns-cancel").hidden, true);
  assert.equal(a.querySelector(".agentruns-again").hidden, false);
  // Polling and the clock run only while the panel is shown.
  assert.deepEqual(timers.map((timer) => timer.ms).sort((x, y) => x - y), [1000, 5000]);
});

test("the look for new runs waits while the browser tab is in the background", async () => {
  const server = fakeServer([runObject("run_a")]);
  const { panel, timers } = makePanel(fakeHub());
  panel.show();
  await until(() => rows(panel).length === 1);
  const poll = timers.find((timer) => timer.ms === 5000);
  Object.defineProperty(document, "hidden", { value: true, configurable: true });
  poll.fn();
  await sleep(10); // no request within this time
  assert.equal(server.requests.length, 1);
  Object.defineProperty(document, "hidden", { value: false, configurable: true });
  poll.fn();
  await until(() => server.requests.length === 2);
  assert.equal(server.requests.length, 2);
});

test("an empty list says how to start a run, and filters that match nothing say so", async () => {
  fakeServer([]);
  const { panel } = makePanel(fakeHub());
  await panel.refresh();
  assert.equal(panel.empty.hidden, false);
  assert.match(panel.empty.textContent, /Start one with New run, or from a notebook's cell: %%agent demo/);
  panel.statusFilter.value = "failed";
  await panel.reload();
  assert.equal(panel.empty.textContent, "No runs match these filters.");
});

test("active runs follow the page's stream from their last_seq; a terminal event ends the following", async () => {
  fakeServer([runObject("run_live"), runObject("run_done", { status: "failed", error: { type: "x", message: "no" } })]);
  const hub = fakeHub();
  const { panel } = makePanel(hub);
  await panel.refresh();
  assert.deepEqual([...hub.cursors], [["run_live", 2]]);
  const listener = hub.listeners.get("run_live");
  listener.onEvent({ run_id: "run_live", seq: 3, type: "usage", ts: TS, data: { input_tokens: 10, output_tokens: 5 } });
  const [live] = rows(panel);
  assert.equal(text(live, ".agentruns-panel-tokens"), "15 tokens");
  listener.onEvent({ run_id: "run_live", seq: 4, type: "run.succeeded", ts: "2026-01-01T00:09:30.000Z", data: { output: null } });
  assert.equal(live.dataset.status, "succeeded");
  assert.equal(text(live, ".agentruns-panel-timing"), "took 2 min 29 s");
  assert.equal(hub.listeners.has("run_live"), false);
});

test("a refresh shows runs started elsewhere and drops runs that are gone", async () => {
  const server = fakeServer([runObject("run_a", { status: "succeeded" })]);
  const { panel } = makePanel(fakeHub());
  await panel.refresh();
  server.runs = [runObject("run_c"), runObject("run_b", { status: "queued" })];
  await panel.refresh();
  assert.deepEqual(rows(panel).map((row) => row.dataset.runId), ["run_c", "run_b"]);
});

test("Cancel asks the server and shows the run cancelling; Run again starts a retry and lists it first", async () => {
  const server = fakeServer([runObject("run_a"), runObject("run_old", { status: "failed", input: { prompt: "again" }, metadata: { cell_id: "c1" } })]);
  const { panel } = makePanel(fakeHub());
  await panel.refresh();
  const [a, old] = rows(panel);
  a.querySelector(".agentruns-cancel").click();
  await until(() => a.dataset.status === "cancelling");
  assert.equal(server.posted[0].path, "/api/agentruns/runs/run_a/cancel");
  assert.equal(server.posted[0].headers["X-XSRFToken"], "tok");
  assert.equal(a.dataset.status, "cancelling");
  assert.equal(a.querySelector(".agentruns-cancel").hidden, true);

  old.querySelector(".agentruns-again").click();
  await until(() => rows(panel)[0].dataset.runId === "run_new2");
  const retry = server.posted[1];
  assert.equal(retry.path, "/api/agentruns/runs");
  assert.ok(retry.headers["Idempotency-Key"]);
  assert.deepEqual(retry.body, { agent: "demo", input: { prompt: "again" }, session: "work/analysis.ipynb", metadata: { cell_id: "c1" }, retry_of: "run_old" });
  assert.equal(rows(panel)[0].dataset.runId, "run_new2");
  assert.equal(rows(panel)[0].dataset.status, "queued");
});

test("Run again after a network error sends the same Idempotency-Key: one click, one run", async () => {
  const server = fakeServer([runObject("run_lost", { status: "failed" })]);
  const { panel } = makePanel(fakeHub());
  await panel.refresh();
  const answer = globalThis.fetch;
  const keys = [];
  globalThis.fetch = async (url, init = {}) => {
    if (init.method === "POST") keys.push(init.headers["Idempotency-Key"]);
    if (keys.length === 1) throw new TypeError("network down");
    return answer(url, init);
  };
  const [row] = rows(panel);
  row.querySelector(".agentruns-again").click();
  await until(() => text(row, ".agentruns-panel-note") !== "");
  assert.equal(text(row, ".agentruns-panel-note"), "Run again failed: cannot reach the server.");
  row.querySelector(".agentruns-again").click();
  await until(() => rows(panel)[0].dataset.runId !== "run_lost");
  assert.equal(keys.length, 2);
  assert.equal(keys[0], keys[1]);
  assert.equal(server.posted.length, 1);
});

test("a failed action says why on its row and changes nothing", async () => {
  fakeServer([runObject("run_gone")]);
  const { panel } = makePanel(fakeHub());
  await panel.refresh();
  globalThis.fetch = async () => Response.json({ error: "run_not_found", message: "run run_gone was not found" }, { status: 404 });
  const [row] = rows(panel);
  row.querySelector(".agentruns-cancel").click();
  await until(() => row.querySelector(".agentruns-panel-note").textContent !== "");
  assert.equal(text(row, ".agentruns-panel-note"), "Cancel failed: run run_gone was not found");
  assert.equal(row.dataset.status, "running");
});

test("an open question shows its choices; a click answers it", async () => {
  const inputs = [{ request_id: "req_1", kind: "approval", title: "Send the email?", details: null, choices: ["approve", "reject"], status: "open" }];
  const server = fakeServer([runObject("run_q", { status: "waiting", snapshot: { messages: [], tools: [], progress: null, usage: null, inputs } })]);
  const { panel } = makePanel(fakeHub());
  await panel.refresh();
  const [row] = rows(panel);
  assert.equal(text(row, ".agentruns-chip"), "waiting");
  assert.equal(text(row, ".agentruns-input-title"), "Send the email?");
  row.querySelector('.agentruns-choice[data-choice="approve"]').click();
  await until(() => server.posted.length > 0);
  assert.equal(server.posted[0].path, "/api/agentruns/runs/run_q/inputs/req_1");
  assert.deepEqual(server.posted[0].body, { choice: "approve" });
});

test("a waiting permission shows the agent's option names and the step it is about; a click answers with the option's id", async () => {
  const hostile = '<img src="http://127.0.0.1:9/x" onerror="globalThis.pwned=1">';
  const inputs = [{
    request_id: "req_p", kind: "permission", title: "Run the tests?", choices: ["yes-once", "no"], status: "open",
    details: {
      options: [{ optionId: "yes-once", name: "Allow once", kind: "allow_once" }, { optionId: "no", name: hostile, kind: "reject_once" }],
      tool: { title: "pytest -q", kind: "execute", content: [{ type: "text", text: "pytest -q tests/" }] },
    },
  }];
  const server = fakeServer([runObject("run_p", { status: "waiting", snapshot: { messages: [], tools: [], progress: null, usage: null, inputs } })]);
  const { panel } = makePanel(fakeHub());
  await panel.refresh();
  const [row] = rows(panel);
  const buttons = [...row.querySelectorAll(".agentruns-choice")];
  // A name over 60 characters is cut, the whole of it (as text) on hover.
  assert.deepEqual(buttons.map((node) => [node.textContent, node.dataset.choice]), [["Allow once", "yes-once"], [`${hostile.slice(0, 59)}…`, "no"]]);
  assert.equal(buttons[1].title, `${hostile} (reject once)`);
  assert.equal(row.querySelector("img"), null);
  assert.equal(text(row, ".agentruns-input-tool-title"), "pytest -q");
  assert.equal(text(row, ".agentruns-tool-kind"), "execute");
  assert.equal(text(row, ".agentruns-tool-text"), "pytest -q tests/");
  buttons[0].click();
  await until(() => server.posted.length > 0);
  assert.deepEqual(server.posted[0].body, { choice: "yes-once" });
});

test("what an agent or a model wrote is shown as text in a row: no element, no fetch", async () => {
  const hostile = '<img src="http://127.0.0.1:9/x" onerror="globalThis.pwned=1"> ![i](http://127.0.0.1:9/y)';
  const inputs = [{ request_id: "req_1", kind: "choice", title: hostile, details: hostile, choices: [hostile, "no"], status: "open" }];
  fakeServer([
    runObject("run_h", {
      agent: hostile, status: "waiting", session: `work/${hostile}.ipynb`,
      snapshot: { messages: [{ id: "m1", role: "assistant", text: hostile, done: true }], tools: [], progress: null, usage: { input_tokens: hostile, output_tokens: 2 }, inputs },
    }),
    runObject("run_f", { status: "failed", error: { type: hostile, message: hostile }, finished_at: TS }),
    runObject("run_c", { status: "cancelled", cancel: { reason: hostile }, finished_at: TS }),
  ]);
  const { panel } = makePanel(fakeHub());
  await panel.refresh();
  assert.equal(rows(panel).length, 3);
  assert.equal(panel.node.querySelector("img, script, iframe, svg"), null);
  const [row] = rows(panel);
  assert.equal(text(row, ".agentruns-panel-agent"), hostile);
  assert.equal(text(row, ".agentruns-input-title"), hostile);
  assert.equal(row.querySelector(".agentruns-panel-notebook").title, `Open work/${hostile}.ipynb`);
});

test("filters by status and notebook ask the server; the notebooks to choose are those of the runs seen", async () => {
  const server = fakeServer([
    runObject("run_c", { session: "b.ipynb" }),
    runObject("run_b", { status: "failed", session: "a.ipynb" }),
    runObject("run_a", { status: "failed", session: "b.ipynb" }),
  ]);
  const { panel } = makePanel(fakeHub());
  await panel.refresh();
  assert.deepEqual(Array.from(panel.sessionFilter.options, (option) => option.value), ["", "a.ipynb", "b.ipynb"]);
  panel.statusFilter.value = "failed";
  panel.statusFilter.dispatchEvent(new window.Event("change"));
  await until(() => rows(panel).length === 2);
  assert.equal(server.requests.at(-1).query.get("status"), "failed");
  assert.deepEqual(rows(panel).map((row) => row.dataset.runId), ["run_b", "run_a"]);
  panel.sessionFilter.value = "b.ipynb";
  panel.sessionFilter.dispatchEvent(new window.Event("change"));
  await until(() => rows(panel).length === 1);
  assert.equal(server.requests.at(-1).query.get("session"), "b.ipynb");
  assert.deepEqual(rows(panel).map((row) => row.dataset.runId), ["run_a"]);
});

test("More pages on from the oldest run shown; a refresh then keeps every page", async () => {
  const many = Array.from({ length: PAGE_SIZE + 5 }, (_, i) => runObject(`run_${String(100 - i)}`, { status: "succeeded" }));
  const server = fakeServer(many);
  const { panel } = makePanel(fakeHub());
  await panel.refresh();
  assert.equal(rows(panel).length, PAGE_SIZE);
  assert.equal(panel.moreButton.hidden, false);
  panel.moreButton.click();
  await until(() => rows(panel).length === PAGE_SIZE + 5);
  assert.equal(server.requests.at(-1).query.get("before"), many[PAGE_SIZE - 1].run_id);
  assert.equal(rows(panel).length, PAGE_SIZE + 5);
  assert.equal(panel.moreButton.hidden, true);
  await panel.refresh();
  assert.equal(server.requests.at(-1).query.get("limit"), String(PAGE_SIZE + 5));
  assert.equal(rows(panel).length, PAGE_SIZE + 5);
});

test("the notebook's name opens it, by its path under the server's root", async () => {
  fakeServer([
    runObject("run_c", { session: "/home/me/project/work/analysis.ipynb" }),
    runObject("run_b", { session: "/elsewhere/other.ipynb" }),
    runObject("run_a"),
  ]);
  const opened = [];
  const { panel } = makePanel(fakeHub(), { openPath: (path) => opened.push(path), serverRoot: "/home/me/project" });
  await panel.refresh();
  const [inside, outside, relative] = rows(panel).map((row) => row.querySelector(".agentruns-panel-notebook"));
  inside.click();
  outside.click();
  relative.click();
  assert.deepEqual(opened, ["work/analysis.ipynb", "work/analysis.ipynb"]);
  assert.equal(inside.textContent, "analysis.ipynb");
  assert.equal(inside.title, "Open work/analysis.ipynb");
  assert.equal(outside.title, "/elsewhere/other.ipynb (not a file under this server's root)");
  assert.ok(outside.classList.contains("agentruns-panel-notebook--none"));
});

test("a session maps to a path under the server's root only when it is one", () => {
  assert.equal(contentsPath("a/b.ipynb", "/srv"), "a/b.ipynb");
  assert.equal(contentsPath("/srv/a/b.ipynb", "/srv/"), "a/b.ipynb");
  assert.equal(contentsPath("/srvx/b.ipynb", "/srv"), null);
  assert.equal(contentsPath("/srv/b.ipynb", null), null);
  assert.equal(contentsPath("chat:42", "/srv"), null);
});

test("a server that cannot be reached is said once, and the list stays as it was", async () => {
  fakeServer([runObject("run_a")]);
  const { panel } = makePanel(fakeHub());
  await panel.refresh();
  globalThis.fetch = async () => {
    throw new TypeError("network");
  };
  await panel.refresh();
  assert.equal(panel.message.hidden, false);
  assert.match(panel.message.textContent, /Cannot reach the server/);
  assert.equal(rows(panel).length, 1);
});

test("words for tokens, timing and paths", () => {
  assert.equal(describeTokens(null), "");
  assert.equal(describeTokens({ input_tokens: 3, output_tokens: 4, estimated: true }), "≈ 7 tokens");
  // What an agent said is not always a count: never shown as one.
  assert.equal(describeTokens({ input_tokens: -1000, output_tokens: 4 }), "? tokens");
  assert.equal(describeTokens({ input_tokens: "many", output_tokens: 4, cost: -1 }), "? tokens");
  assert.equal(describeTokens({ input_tokens: 1500, output_tokens: 4, cost: 0.5 }), "1,504 tokens · cost 0.50");
  assert.equal(baseName("a/b/c.ipynb"), "c.ipynb");
  const state = new RunState("run_x");
  state.loadRun(runObject("run_x", { status: "queued", started_at: null }));
  assert.equal(timingWords(state, NOW), "not started yet");
});

/** A fetch whose answers the test releases one by one. */
function heldServer(answer) {
  const held = [];
  globalThis.fetch = (url, init = {}) =>
    new Promise((resolve) => held.push({ url: new URL(url, "http://localhost"), init, release: () => resolve(answer(new URL(url, "http://localhost"), init)) }));
  return held;
}

test("a slow server is not asked again before it answered, and its answer is shown", async () => {
  const held = heldServer(() => Response.json({ runs: [runObject("run_slow")], next: null }));
  const { panel } = makePanel(fakeHub());
  const first = panel.refresh();
  panel.refresh();
  panel.refresh();
  assert.equal(held.length, 1);
  held[0].release();
  await first;
  assert.deepEqual(rows(panel).map((row) => row.dataset.runId), ["run_slow"]);
});

test("a refresh due while More reads a page waits for it and keeps that page", async () => {
  const many = Array.from({ length: PAGE_SIZE + 3 }, (_, i) => runObject(`run_${String(100 - i)}`, { status: "succeeded" }));
  fakeServer(many);
  const { panel } = makePanel(fakeHub());
  await panel.refresh();
  const server = fakeServer(many);
  const more = panel.more();
  const refresh = panel.refresh(); // the tick, while More's answer is on its way
  await Promise.all([more, refresh]);
  await panel.refresh();
  assert.equal(rows(panel).length, PAGE_SIZE + 3);
  assert.deepEqual(server.requests.map((request) => request.query.get("limit")), [String(PAGE_SIZE), String(PAGE_SIZE + 3)]);
});

test("an answer that comes back after the filters changed does not follow a run no longer listed", async () => {
  fakeServer([runObject("run_a", { session: "a.ipynb" }), runObject("run_b", { session: "b.ipynb" })]);
  const hub = fakeHub();
  const { panel } = makePanel(hub);
  await panel.refresh();
  const held = heldServer((url) =>
    url.pathname.endsWith("/cancel")
      ? Response.json(runObject("run_a", { session: "a.ipynb", status: "cancelling", last_seq: 3 }), { status: 202 })
      : Response.json({ runs: [runObject("run_b", { session: "b.ipynb" })], next: null })
  );
  rows(panel)[0].querySelector(".agentruns-cancel").click();
  panel.sessionFilter.value = "b.ipynb";
  const reloaded = panel.reload();
  for (const request of held) request.release();
  await reloaded;
  await sleep(10); // the late answer, had it followed run_a, would have within this time
  assert.deepEqual(rows(panel).map((row) => row.dataset.runId), ["run_b"]);
  assert.deepEqual([...hub.listeners.keys()], ["run_b"]);
});

test("a gap is read again once for all the events behind it; an event it cannot apply stops the following", async () => {
  const server = fakeServer([runObject("run_gap", { last_seq: 2 })]);
  const hub = fakeHub();
  const { panel } = makePanel(hub);
  await panel.refresh();
  const listener = hub.listeners.get("run_gap");
  server.runs[0] = runObject("run_gap", { last_seq: 6 });
  globalThis.fetch = async (url) => {
    server.requests.push({ path: new URL(url, "http://x").pathname });
    return Response.json(server.runs[0]);
  };
  for (const seq of [5, 6]) listener.onEvent({ run_id: "run_gap", seq, type: "progress", ts: TS, data: { fraction: 0.5, message: "x" } });
  await until(() => hub.cursors.get("run_gap") === 6);
  assert.equal(server.requests.filter((request) => request.path === "/api/agentruns/runs/run_gap").length, 1);
  assert.equal(hub.cursors.get("run_gap"), 6); // following again, from what it read
  const [row] = rows(panel);
  hub.listeners.get("run_gap").onEvent({ run_id: "run_gap", seq: 7, type: "text.delta", ts: TS, data: { message_id: "nope" } });
  assert.equal(hub.listeners.has("run_gap"), false);
  assert.match(text(row, ".agentruns-panel-note"), /cannot be shown here/);
});

test("each card says what its run was asked and how it went, in the same words as everywhere", async () => {
  const hostile = '<img src=x onerror="globalThis.pwned=1"> weekly';
  fakeServer([
    runObject("run_c", { status: "waiting" }),
    runObject("run_b", { status: "cancelled", started_at: null, finished_at: TS, metadata: { title: hostile } }),
    runObject("run_a", { status: "queued", started_at: null, input: { prompt: "Summarise the notes\nin three lines" } }),
  ]);
  const { panel } = makePanel(fakeHub());
  panel.show();
  await until(() => rows(panel).length === 3);
  const [c, b, a] = rows(panel);
  assert.equal(text(c, ".agentruns-panel-run-title"), "run_c");
  assert.equal(text(c, ".agentruns-panel-timing"), "waiting for an answer");
  assert.equal(text(b, ".agentruns-panel-run-title"), hostile);
  assert.equal(panel.node.querySelector("img"), null);
  assert.equal(text(b, ".agentruns-panel-timing"), "never started");
  assert.equal(text(a, ".agentruns-panel-run-title"), "Summarise the notes");
  assert.equal(text(a, ".agentruns-panel-timing"), "not started yet");
  panel.dispose();
});

test("the list sorts the runs it shows by time, status or title", async () => {
  fakeServer([
    runObject("run_c", { status: "succeeded", input: { prompt: "beta" } }),
    runObject("run_b", { status: "running", input: { prompt: "gamma" } }),
    runObject("run_a", { status: "failed", input: { prompt: "Alpha" } }),
  ]);
  const { panel } = makePanel(fakeHub());
  panel.show();
  await until(() => rows(panel).length === 3);
  const order = () => rows(panel).map((row) => row.dataset.runId);
  assert.deepEqual(order(), ["run_c", "run_b", "run_a"]);
  for (const [sort, expected] of [["oldest", ["run_a", "run_b", "run_c"]], ["status", ["run_b", "run_c", "run_a"]], ["title", ["run_a", "run_c", "run_b"]], ["newest", ["run_c", "run_b", "run_a"]]]) {
    panel.sortSelect.value = sort;
    panel.sortSelect.dispatchEvent(new window.Event("change"));
    assert.deepEqual(order(), expected, sort);
  }
});

test("the search asks the server once the typing pauses, and a run's title opens its page", async () => {
  const server = fakeServer([runObject("run_a")]);
  document.body.dataset.agentrunsRunPages = "true";
  const opened = [];
  const { panel } = makePanel(fakeHub(), { openRun: (runId) => opened.push(runId) });
  panel.show();
  await until(() => rows(panel).length === 1);
  panel.search.value = "weath";
  panel.search.dispatchEvent(new window.Event("input"));
  panel.search.value = "weather";
  panel.search.dispatchEvent(new window.Event("input"));
  await until(() => server.requests.some((request) => request.query.get("q") !== null), { what: "the search to be asked" });
  const searches = server.requests.filter((request) => request.query.get("q") !== null);
  assert.deepEqual(searches.map((request) => request.query.get("q")), ["weather"]);
  rows(panel)[0].querySelector(".agentruns-panel-run-title").click();
  assert.deepEqual(opened, ["run_a"]);
});

test("a run deleted on its page leaves the list at once", async () => {
  fakeServer([runObject("run_b"), runObject("run_a")]);
  const { panel } = makePanel(fakeHub());
  panel.show();
  await until(() => rows(panel).length === 2);
  document.dispatchEvent(new window.CustomEvent("agentruns:run-deleted", { detail: { runId: "run_a" } }));
  assert.deepEqual(rows(panel).map((row) => row.dataset.runId), ["run_b"]);
});

test("a run's row says how many notebook edits it made, and how many were undone", async () => {
  const edit = (editId, status) => ({ edit_id: editId, notebook: "work/analysis.ipynb", op: "edit", cell_id: "c1", index: 0, before: "1", after: "2", status });
  const snapshot = (edits) => ({ messages: [], tools: [], progress: null, usage: { input_tokens: 10, output_tokens: 5 }, inputs: [], edits });
  fakeServer([
    runObject("run_b", { status: "succeeded", snapshot: snapshot([edit("e1", "applied"), edit("e2", "undone"), edit("e3", "conflict")]) }),
    runObject("run_a", { status: "succeeded", snapshot: snapshot([edit("e1", "applied")]) }),
    runObject("run_0", { status: "succeeded" }),
  ]);
  const { panel } = makePanel(fakeHub());
  panel.show();
  await until(() => rows(panel).length === 3);
  const [b, a, none] = rows(panel);
  assert.equal(text(b, ".agentruns-panel-edits"), "3 edits · 1 undone");
  assert.equal(text(a, ".agentruns-panel-edits"), "1 edit");
  assert.equal(text(none, ".agentruns-panel-edits"), "", "a run that edited no notebook says nothing of edits");
  assert.equal(text(b, ".agentruns-panel-tokens"), "15 tokens");
});

test("a run's count of notebook edits opens its page at them, where run pages open", async () => {
  const edit = { edit_id: "e1", notebook: "n.ipynb", op: "insert", cell_id: "c1", index: 0, before: null, after: "2", status: "applied" };
  const snapshot = (edits) => ({ messages: [], tools: [], progress: null, usage: null, inputs: [], edits });
  fakeServer([runObject("run_b", { status: "succeeded", snapshot: snapshot([edit]) }), runObject("run_a", { status: "succeeded", snapshot: snapshot([]) })]);
  document.body.dataset.agentrunsRunPages = "true";
  const opened = [];
  const { panel } = makePanel(fakeHub(), { openRun: (runId, at) => opened.push([runId, at]) });
  panel.show();
  await until(() => rows(panel).length === 2);
  const [b, a] = rows(panel).map((row) => row.querySelector(".agentruns-panel-edits"));
  assert.equal(b.getAttribute("href"), "#");
  assert.equal(b.title, "See these edits, with their diffs and Undo, on the run's page");
  b.click();
  assert.deepEqual(opened, [["run_b", ""]]);
  assert.equal(a.hasAttribute("href"), false, "no edits: nothing to open");
  a.click();
  assert.equal(opened.length, 1);
});

test("without run pages (Notebook 7) the count of edits is text", async () => {
  const edit = { edit_id: "e1", notebook: "n.ipynb", op: "insert", cell_id: "c1", index: 0, before: null, after: "2", status: "applied" };
  fakeServer([runObject("run_b", { status: "succeeded", snapshot: { messages: [], tools: [], progress: null, usage: null, inputs: [], edits: [edit] } })]);
  const opened = [];
  const { panel } = makePanel(fakeHub(), { openRun: (runId, at) => opened.push([runId, at]) });
  panel.show();
  await until(() => rows(panel).length === 1);
  const count = rows(panel)[0].querySelector(".agentruns-panel-edits");
  assert.equal(count.textContent, "1 edit");
  assert.equal(count.hasAttribute("href"), false);
  count.click();
  assert.deepEqual(opened, []);
});

test("Conversations lists the conversations instead of the runs, and a click opens one", async () => {
  fakeServer([runObject("run_a")]);
  const runsFetch = globalThis.fetch;
  const conversation = { session: "work/analysis.ipynb", agent: "demo", title: "first question", runs: 2, last_run_id: "run_a", updated_at: TS };
  globalThis.fetch = async (url, init) =>
    new URL(url, "http://localhost").pathname === "/api/agentruns/conversations" ? Response.json({ conversations: [conversation], next: null }) : runsFetch(url, init);
  document.body.dataset.agentrunsRunPages = "true";
  const opened = [];
  const { panel } = makePanel(fakeHub(), { openConversation: (c) => opened.push(c) });
  panel.show();
  await until(() => rows(panel).length === 1);
  assert.equal(panel.conversationsButton.hidden, false);
  panel.conversationsButton.click();
  const row = await until(() => panel.node.querySelector(".agentruns-conversation"), { what: "the conversation's row" });
  assert.equal(row.querySelector(".agentruns-conversation-title").textContent, "first question");
  assert.equal(row.querySelector(".agentruns-conversation-runs").textContent, "2 runs");
  assert.equal(row.querySelector(".agentruns-conversation-age").textContent, "1 min ago");
  assert.ok(panel.list.classList.contains("agentruns-panel-away"), "the runs step aside");
  assert.equal(panel.conversationsButton.textContent, "Runs");
  row.click();
  assert.deepEqual(opened, [conversation]);
  panel.conversationsButton.click();
  assert.ok(!panel.list.classList.contains("agentruns-panel-away"));
  assert.equal(panel.conversations.node.hidden, true);
  panel.dispose();
});

test("without a way to open conversations, the panel has no Conversations", () => {
  fakeServer([]);
  const { panel } = makePanel(fakeHub());
  assert.equal(panel.conversationsButton, null);
  assert.equal(panel.node.querySelector(".agentruns-conversations"), null);
  panel.dispose();
});

test("two runs ticked show Compare, which asks for them side by side; a third tick unticks the oldest", async () => {
  document.body.dataset.agentrunsRunPages = "true";
  fakeServer([runObject("run_c", { status: "succeeded" }), runObject("run_b", { status: "succeeded" }), runObject("run_a", { status: "failed" })]);
  const { panel } = makePanel(fakeHub(), { openRun: () => {} });
  panel.show();
  await until(() => rows(panel).length === 3);
  const [c, b, a] = rows(panel);
  const compare = panel.node.querySelector(".agentruns-panel-compare");
  const tick = (row) => {
    const box = row.querySelector(".agentruns-panel-pick");
    box.checked = !box.checked;
    box.dispatchEvent(new Event("change"));
  };
  assert.equal(compare.hidden, true);
  tick(a);
  assert.equal(compare.hidden, true);
  tick(b);
  assert.equal(compare.hidden, false);
  tick(c);
  assert.equal(a.querySelector(".agentruns-panel-pick").checked, false);
  const asked = [];
  document.addEventListener("agentruns:compare", (event) => asked.push(event.detail));
  compare.click();
  assert.deepEqual(asked, [{ left: "run_b", right: "run_c" }]);
  tick(b);
  assert.equal(compare.hidden, true);
});
