// A run's own page: its timeline's words, where its cell is, and deleting it.
import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";

import { installPage, until } from "./dom.mjs";

installPage();
const { offsetWords, runCell, timelineEntries, RunPage } = await import("../src/runpage.js");

beforeEach(() => installPage());

const at = (seconds) => new Date(Date.parse("2026-01-01T00:00:00.000Z") + seconds * 1000).toISOString();

test("the timeline says each step once: a message's deltas are one entry, questions name their answer", () => {
  const events = [
    { seq: 1, type: "run.started", ts: at(0), data: {} },
    { seq: 2, type: "tool.started", ts: at(1), data: { call_id: "c1", name: "search", args: {} } },
    { seq: 3, type: "tool.completed", ts: at(2), data: { call_id: "c1", ok: true } },
    { seq: 4, type: "input.requested", ts: at(3), data: { request_id: "q1", kind: "approval", title: "Write the answer?", choices: ["approve", "deny"] } },
    { seq: 5, type: "input.resolved", ts: at(4), data: { request_id: "q1", choice: "approve", note: null, by: "Anonymous Io" } },
    { seq: 6, type: "message.started", ts: at(5), data: { message_id: "m1", role: "assistant" } },
    { seq: 7, type: "text.delta", ts: at(5), data: { message_id: "m1", delta: "Hello " } },
    { seq: 8, type: "usage", ts: at(6), data: { input_tokens: 1000, output_tokens: 234, cost: 0.5 } },
    { seq: 9, type: "text.delta", ts: at(6), data: { message_id: "m1", delta: "world" } },
    { seq: 10, type: "text.delta", ts: at(6), data: { message_id: "m1", delta: "!" } },
    { seq: 11, type: "run.cancel_requested", ts: at(7), data: { reason: "enough" } },
    { seq: 12, type: "run.cancelled", ts: at(7), data: { reason: "enough" } },
  ];
  const entries = timelineEntries(events);
  assert.deepEqual(entries.map((entry) => entry.text), [
    "started",
    "tool search started",
    "tool search completed",
    "asked: Write the answer?",
    "answered Write the answer?: approved",
    "wrote 12 characters",
    "usage: 1,234 tokens (1,000 in · 234 out) · cost 0.50",
    "cancel requested: enough",
    "cancelled: enough",
  ]);
  // A later page goes on where the last one ended: the text still streaming grows.
  const memory = { asked: new Map(), tools: new Map() };
  const more = timelineEntries(events.slice(0, 7), [], memory);
  timelineEntries([{ seq: 8, type: "text.delta", ts: at(6), data: { message_id: "m1", delta: "abc" } }], more, memory);
  assert.equal(more[more.length - 1].text, "wrote 9 characters");
  assert.equal(offsetWords(at(4), Date.parse(at(0))), "+4.0 s");
  // Counts an agent did not report are estimates, and the line says so.
  const [estimated] = timelineEntries([{ seq: 1, type: "usage", ts: at(0), data: { input_tokens: 30, output_tokens: 4, estimated: true } }]);
  assert.equal(estimated.text, "usage: ≈ 34 tokens (30 in · 4 out) (estimated)");
  // Progress reports between two steps are one entry, the last one said; a step starts the next.
  const progress = timelineEntries([
    { seq: 1, type: "progress", ts: at(0), data: { fraction: 0, message: "searching" } },
    { seq: 2, type: "progress", ts: at(1), data: { fraction: 0.5, message: "half" } },
    { seq: 3, type: "tool.started", ts: at(1), data: { call_id: "c", name: "t" } },
    { seq: 4, type: "progress", ts: at(2), data: { fraction: 1, message: "done" } },
  ]);
  assert.deepEqual(progress.map((entry) => [entry.seq, entry.text]), [[1, "progress 50%: half"], [3, "tool t started"], [4, "progress 100%: done"]]);
});

test("a run's cell comes from its metadata; a path on disk opens nothing", () => {
  assert.deepEqual(runCell({ session: "a/b.ipynb", metadata: { notebook: "a/b.ipynb", cell_id: "c-1" } }), { path: "a/b.ipynb", cellId: "c-1" });
  assert.deepEqual(runCell({ session: "a/b.ipynb", metadata: {} }), { path: "a/b.ipynb", cellId: null });
  assert.deepEqual(runCell({ session: "/home/me/b.ipynb", metadata: {} }), { path: null, cellId: null });
  assert.deepEqual(runCell({ session: null, metadata: {} }), { path: null, cellId: null });
});

test("Delete asks first, then deletes and tells the lists", async () => {
  const run = {
    run_id: "run_x", agent: "demo", status: "succeeded", session: "n.ipynb", metadata: { cell_id: "c1" }, input: { prompt: "hi" },
    retry_of: null, created_at: at(0), started_at: at(0), finished_at: at(1), last_seq: 1, first_seq: 1,
    snapshot: { messages: [], tools: [], progress: null, usage: null, inputs: [] }, output: null, error: null, cancel: null,
  };
  const requests = [];
  globalThis.fetch = async (url, init = {}) => {
    const parsed = new URL(url, "http://localhost");
    requests.push(`${init.method || "GET"} ${parsed.pathname}${parsed.search}`);
    if (init.method === "DELETE") return new Response(null, { status: 204 });
    if (parsed.pathname.endsWith("/events")) return Response.json({ events: [{ seq: 1, type: "run.succeeded", ts: at(1), data: {} }], last_seq: 1, status: "succeeded", done: true });
    if (parsed.pathname === "/api/agentruns/runs") return Response.json({ runs: [], next: null });
    return Response.json(run);
  };
  const cells = [];
  const page = new RunPage({ baseUrl: "/", runId: "run_x", openCell: (path, cellId) => cells.push([path, cellId]) });
  document.body.append(page.node);
  await page.load();
  assert.equal(page.titleNode.textContent, "hi");
  // When it was created, in words a person reads (never the API's ISO form).
  assert.match(page.where.textContent, /^demo · n\.ipynb · created .*2026/);
  assert.equal(page.where.textContent.includes(run.created_at), false);
  assert.equal(page.timeline.textContent.includes("succeeded"), true);
  await page.goToCell();
  assert.deepEqual(cells, [["n.ipynb", "c1"]]);
  const deleted = [];
  document.addEventListener("agentruns:run-deleted", (event) => deleted.push(event.detail.runId));
  page.deleteButton.click();
  assert.equal(page.confirm.hidden, false);
  assert.equal(requests.some((line) => line.startsWith("DELETE")), false);
  page.node.querySelector(".agentruns-runpage-delete-yes").click();
  await until(() => page.node.dataset.deleted === "true");
  assert.ok(requests.includes("DELETE /api/agentruns/runs/run_x"));
  assert.deepEqual(deleted, ["run_x"]);
  assert.equal(page.node.dataset.deleted, "true");
  // The page says so, and offers nothing more to do with the run.
  assert.match(page.message.textContent, /^This run was deleted/);
  assert.equal(page.message.hidden, false);
  assert.equal(page.titleNode.textContent, "hi (deleted)");
  const offered = (node) => node.closest("[hidden]") === null;
  const buttons = Array.from(page.node.querySelectorAll("button")).filter(offered).map((node) => node.textContent);
  assert.deepEqual(buttons, []);
  page.dispose();
});

test("the timeline reads the events a page at a time: Load more reads the next", async () => {
  const events = [
    { seq: 1, type: "run.started", ts: at(0), data: {} },
    { seq: 2, type: "tool.started", ts: at(1), data: { call_id: "a", name: "one" } },
    { seq: 3, type: "tool.completed", ts: at(2), data: { call_id: "a", ok: true } },
    { seq: 4, type: "tool.started", ts: at(3), data: { call_id: "b", name: "two" } },
    { seq: 5, type: "run.succeeded", ts: at(4), data: {} },
  ];
  const asked = [];
  globalThis.fetch = async (url) => {
    const parsed = new URL(url, "http://localhost");
    if (parsed.pathname.endsWith("/events")) {
      const after = Number(parsed.searchParams.get("after"));
      const limit = Number(parsed.searchParams.get("limit"));
      asked.push([after, limit]);
      const page = events.filter((event) => event.seq > after).slice(0, limit);
      return Response.json({ events: page, last_seq: 5, status: "succeeded", done: page.at(-1)?.seq === 5 });
    }
    if (parsed.pathname === "/api/agentruns/runs") return Response.json({ runs: [], next: null });
    return Response.json({
      run_id: "run_p", agent: "demo", status: "succeeded", session: null, metadata: {}, input: {}, retry_of: null,
      created_at: at(0), started_at: at(0), finished_at: at(4), last_seq: 5, first_seq: 1,
      snapshot: { messages: [], tools: [], progress: null, usage: null, inputs: [] }, output: null, error: null, cancel: null,
    });
  };
  const page = new RunPage({ baseUrl: "/", runId: "run_p", pageSize: 2 });
  document.body.append(page.node);
  await page.load();
  const steps = () => Array.from(page.timeline.querySelectorAll(".agentruns-runpage-event-text"), (node) => node.textContent);
  assert.deepEqual(steps(), ["started", "tool one started"]);
  assert.equal(page.moreButton.hidden, false);
  page.moreButton.click();
  await until(() => steps().length === 4);
  page.moreButton.click();
  await until(() => steps().length === 5);
  assert.deepEqual(steps(), ["started", "tool one started", "tool one completed", "tool two started", "succeeded"]);
  assert.equal(page.moreButton.hidden, true);
  assert.deepEqual(asked, [[0, 2], [2, 2], [4, 2]]);
  assert.equal(page.cellButton.disabled, true); // no notebook: nowhere to go
  page.dispose();
});

test("the page shows the run's family: the run it was forked from and its forks, each with Compare", async () => {
  const asked = [];
  globalThis.fetch = async (url) => {
    const parsed = new URL(url, "http://localhost");
    if (parsed.pathname.endsWith("/events")) return Response.json({ events: [], last_seq: 0, status: "succeeded", done: true });
    if (parsed.pathname === "/api/agentruns/runs") {
      asked.push(Object.fromEntries(parsed.searchParams));
      if (parsed.searchParams.get("forked_from") !== "run_f") return Response.json({ runs: [], next: null });
      const fork = (id, seq, status) => ({ run_id: id, agent: "openai", status, metadata: {}, input: { prompt: `try ${id}` }, forked_from: { run_id: "run_f", seq } });
      return Response.json({ runs: [fork("run_new", 9, "running"), fork("run_old", 3, "succeeded")], next: null });
    }
    return Response.json({
      run_id: "run_f", agent: "openai", status: "succeeded", session: null, metadata: {}, input: { prompt: "p" }, retry_of: null,
      forked_from: { run_id: "run_o", seq: 4 }, created_at: at(0), started_at: at(0), finished_at: at(1), last_seq: 0, first_seq: 1,
      snapshot: { messages: [], tools: [], progress: null, usage: null, inputs: [] }, output: null, error: null, cancel: null,
    });
  };
  const opened = [];
  const page = new RunPage({ baseUrl: "/", runId: "run_f", openRun: (id) => opened.push(id) });
  document.body.append(page.node);
  await page.load();
  const items = Array.from(page.family.querySelectorAll(".agentruns-runpage-relative"));
  assert.deepEqual(items.map((item) => item.dataset.runId), ["run_o", "run_old", "run_new"]);
  assert.match(items[0].textContent, /this run was forked from it after event 4/);
  assert.match(items[1].textContent, /succeeded · try run_old · forked after event 3/);
  assert.equal(page.family.parentElement.hidden, false);
  assert.ok(asked.some((query) => query.forked_from === "run_f"));
  const compared = [];
  document.addEventListener("agentruns:compare", (event) => compared.push([event.detail.left, event.detail.right]));
  for (const item of items) item.querySelector(".agentruns-runpage-compare").click();
  assert.deepEqual(compared, [["run_o", "run_f"], ["run_f", "run_old"], ["run_f", "run_new"]]);
  items[2].querySelector("a").click();
  assert.deepEqual(opened, ["run_new"]);
  page.dispose();
});

test("the page lists the run's notebook edits as its view does, and its timeline says each change of one in words", async () => {
  const edit = { edit_id: "e1", notebook: "n.ipynb", op: "edit", cell_id: "c1", index: 0, before: "a = 1\n", after: "a = 2\n" };
  const events = [
    { seq: 1, type: "notebook.edit", ts: at(1), data: { ...edit, status: "pending" } },
    { seq: 2, type: "notebook.edit", ts: at(1), data: { ...edit, status: "applied" } },
    { seq: 3, type: "notebook.edit", ts: at(2), data: { ...edit, status: "undone" } },
    { seq: 4, type: "run.succeeded", ts: at(3), data: {} },
  ];
  globalThis.fetch = async (url) => {
    const parsed = new URL(url, "http://localhost");
    if (parsed.pathname.endsWith("/events")) return Response.json({ events, last_seq: 4, status: "succeeded", done: true });
    if (parsed.pathname === "/api/agentruns/runs") return Response.json({ runs: [], next: null });
    return Response.json({
      run_id: "run_e", agent: "demo", status: "succeeded", session: "n.ipynb", metadata: {}, input: { prompt: "fix it" }, retry_of: null,
      created_at: at(0), started_at: at(0), finished_at: at(3), last_seq: 4, first_seq: 1,
      snapshot: { messages: [], tools: [], progress: null, usage: null, inputs: [], edits: [{ ...edit, status: "undone" }] },
      output: null, error: null, cancel: null,
    });
  };
  const page = new RunPage({ baseUrl: "/", runId: "run_e" });
  document.body.append(page.node);
  await page.load();
  await until(() => page.viewNode.querySelector(".agentruns-edit"), { what: "the edits drawn in the page's view" });
  assert.equal(page.viewNode.querySelector(".agentruns-edit-words").textContent, "Edited cell 1");
  assert.equal(page.viewNode.querySelector(".agentruns-edits-count").textContent, "1 edit · 1 undone");
  const steps = Array.from(page.timeline.querySelectorAll(".agentruns-runpage-event-text"), (node) => node.textContent);
  assert.deepEqual(steps, ["Edited cell 1 · pending", "Edited cell 1 · applied", "Edited cell 1 · undone", "succeeded"]);
  page.dispose();
});

test("a page asked for one of its run's edits brings that edit's card into view, once the view draws it", async () => {
  const edit = (editId, index) => ({ edit_id: editId, notebook: "n.ipynb", op: "insert", cell_id: `c${index}`, index, before: null, after: "x\n", status: "applied" });
  const edits = [edit("e1", 0), edit("e2", 1)];
  globalThis.fetch = async (url) => {
    const parsed = new URL(url, "http://localhost");
    if (parsed.pathname.endsWith("/events")) return Response.json({ events: [], last_seq: 4, status: "succeeded", done: true });
    if (parsed.pathname === "/api/agentruns/runs") return Response.json({ runs: [], next: null });
    return Response.json({
      run_id: "run_e", agent: "demo", status: "succeeded", session: "n.ipynb", metadata: {}, input: {}, retry_of: null,
      created_at: at(0), started_at: at(0), finished_at: at(3), last_seq: 4, first_seq: 1,
      snapshot: { messages: [], tools: [], progress: null, usage: null, inputs: [], edits },
      output: null, error: null, cancel: null,
    });
  };
  /** @type {string[]} */
  const scrolled = [];
  window.HTMLElement.prototype.scrollIntoView = function () {
    scrolled.push(this.dataset.editId ?? this.className);
  };
  const page = new RunPage({ baseUrl: "/", runId: "run_e" });
  document.body.append(page.node);
  page.showEdit("e2");
  await page.load();
  await until(() => page.viewNode.querySelector(".agentruns-edit--shown"), { what: "the edit asked for, outlined" });
  assert.equal(page.viewNode.querySelector(".agentruns-edit--shown").dataset.editId, "e2");
  assert.deepEqual(scrolled, ["e2"]);
  // Asked again, for the section (the runs panel's count): the section comes into view.
  page.showEdit("");
  assert.deepEqual(scrolled, ["e2", "agentruns-edits"]);
  assert.equal(page.viewNode.querySelector(".agentruns-edit--shown"), null);
  page.dispose();
});
