// A run's notebook edits in its view: each in words with its diff, Undo, and Undo all newest first.
import assert from "node:assert/strict";
import { afterEach, beforeEach, test } from "node:test";

import { installPage, until } from "./dom.mjs";

installPage();
const { RunView } = await import("../src/view.js");
const { editCard, editWords, outputsSummary, sideText, undoAll, undoAllWords, undoOrder, runEdits } = await import("../src/edits.js");

const RUN = "run_edits";
const NOTEBOOK = "work/analysis.ipynb";

/** The data of a notebook.edit event, as the snapshot keeps the last of each edit_id. */
function edit(editId, fields = {}) {
  return { edit_id: editId, notebook: NOTEBOOK, op: "edit", cell_id: `cell-${editId}`, index: 1, before: "x = 1\n", after: "x = 2\n", status: "applied", ...fields };
}

const EDITS = [
  edit("e1", { op: "insert", index: 0, before: null, after: "import pandas as pd\n" }),
  edit("e2", { op: "edit", index: 1, before: "df = load()\nprint(df)\n", after: "df = load()\ndf.head()\n" }),
  edit("e3", { op: "delete", index: 4, before: "# scratch\n", after: null, status: "undone" }),
  edit("e4", { op: "edit", index: 2, status: "conflict" }),
  edit("e5", { op: "outputs", index: 1, before: [], after: [{ output_type: "stream", name: "stdout", text: ["3 rows\n"] }] }),
];

function runObject(fields = {}) {
  return {
    run_id: RUN, agent: "demo", status: "succeeded", session: NOTEBOOK, metadata: {}, input: { prompt: "tidy the notebook" },
    retry_of: null, created_at: new Date(Date.now() - 60_000).toISOString(), started_at: new Date(Date.now() - 59_000).toISOString(),
    finished_at: new Date().toISOString(), last_seq: 9, first_seq: 1,
    snapshot: { messages: [], tools: [], progress: null, usage: null, edits: structuredClone(EDITS) }, output: null, error: null, cancel: null,
    ...fields,
  };
}

/**
 * A server that has the run, and answers each undo from `undo[edit_id]`: a
 * status (200 answers the run with that edit undone, 409 its conflict), or a
 * promise the test settles.
 */
function fakeServer(undo = {}) {
  const server = { run: runObject(), posted: [] };
  globalThis.fetch = async (url, init = {}) => {
    const path = new URL(url, "http://x").pathname;
    const method = init.method || "GET";
    if (method === "GET" && path === `/api/agentruns/runs/${RUN}`) return Response.json(server.run);
    const match = path.match(/^\/api\/agentruns\/runs\/([^/]+)\/edits\/([^/]+)\/undo$/);
    if (method === "POST" && match) {
      const editId = decodeURIComponent(match[2]);
      server.posted.push(editId);
      const answer = await undo[editId];
      if (answer === 409) return Response.json({ error: "edit_conflict", message: "the cell changed since the agent edited it" }, { status: 409 });
      if (answer === 200) {
        const run = structuredClone(server.run);
        run.last_seq += 1;
        for (const each of run.snapshot.edits) if (each.edit_id === editId) each.status = "undone";
        server.run = run;
        return Response.json(run);
      }
    }
    return Response.json({ error: "edit_not_found", message: "no such edit" }, { status: 404 });
  };
  return server;
}

function fakeHost() {
  return {
    runId: () => RUN, baseUrl: () => null, reattached: () => false, followed: () => "", savedRecord: () => null,
    subscribe: () => () => {}, save: () => {}, ranAgain: () => {},
  };
}

let view;
let el;

beforeEach(() => {
  globalThis.__jupyterAgentrunsHub = { register: () => () => {} };
  delete globalThis.__jupyterAgentrunsActions;
  el = document.createElement("div");
  document.body.replaceChildren(el);
});

afterEach(() => {
  if (view) view.dispose();
  view = null;
  delete globalThis.__jupyterAgentrunsHub;
});

async function shown() {
  view = new RunView(fakeHost(), el);
  view.attach(RUN);
  await until(() => el.querySelectorAll(".agentruns-edit").length > 0, { what: "the run's edits drawn" });
}

const cards = () => Array.from(el.querySelectorAll(".agentruns-edit"));
const card = (editId) => el.querySelector(`.agentruns-edit[data-edit-id="${editId}"]`);
const note = () => el.querySelector(".agentruns-edits-note");

test("each edit says what it did, its status, and shows its cell's diff as files' diffs are shown", async () => {
  fakeServer();
  await shown();
  const words = cards().map((node) => node.querySelector(".agentruns-edit-words").textContent);
  assert.deepEqual(words, [
    "Inserted cell 1",
    "Edited cell 2",
    "Deleted cell 5",
    "Conflict: the cell changed; the edit of cell 3 was not applied",
    "Ran cell 2",
  ]);
  assert.deepEqual(cards().map((node) => node.querySelector(".agentruns-edit-status").textContent), ["applied", "applied", "undone", "conflict", "applied"]);
  assert.equal(el.querySelector(".agentruns-edits-count").textContent, "5 edits · 1 undone");
  const diff = card("e2").querySelector(".agentruns-diff");
  assert.equal(diff.dataset.path, NOTEBOOK);
  assert.deepEqual(
    Array.from(diff.querySelectorAll(".agentruns-diff-line"), (line) => [line.dataset.op, line.textContent]),
    [["hunk", "@@ -1,2 +1,2 @@"], ["context", " df = load()"], ["removed", "-print(df)"], ["added", "+df.head()"]],
  );
  assert.equal(card("e1").querySelector(".agentruns-diff-added").textContent, "+1");
  assert.equal(card("e1").querySelector(".agentruns-diff-new"), null, "a new cell is not a new file");
  assert.equal(card("e3").querySelector(".agentruns-diff-removed").textContent, "−1");
  assert.equal(card("e5").querySelector('.agentruns-diff-line[data-op="added"]').textContent, "+3 rows");
  // Undo for the applied edits only; Undo all while any is applied.
  assert.deepEqual(cards().map((node) => node.querySelector(".agentruns-undo") !== null), [true, true, false, false, true]);
  assert.equal(el.querySelector(".agentruns-undo-all").hidden, false);
  assert.equal(card("e2").querySelector(".agentruns-undo").getAttribute("aria-label"), "Undo: Edited cell 2");
});

test("a run without edits shows no edits section", async () => {
  const server = fakeServer();
  server.run.snapshot = { messages: [], tools: [], progress: null, usage: null };
  view = new RunView(fakeHost(), el);
  view.attach(RUN);
  await until(() => el.querySelector(".agentruns-run").dataset.status === "succeeded");
  assert.equal(el.querySelector(".agentruns-edits").hidden, true);
  assert.equal(el.querySelector(".agentruns-edits-count").textContent, "");
});

test("a double click on Undo sends one request, and the card shows the edit undone", async () => {
  let reply;
  const server = fakeServer({ e2: new Promise((resolve) => (reply = resolve)) });
  await shown();
  const undo = card("e2").querySelector(".agentruns-undo");
  undo.click();
  undo.click();
  assert.equal(undo.disabled, true, "the button waits for the server's answer");
  reply(200);
  await until(() => card("e2").dataset.status === "undone", { what: "e2 shown undone" });
  assert.deepEqual(server.posted, ["e2"]);
  assert.equal(card("e2").querySelector(".agentruns-undo"), null);
  assert.equal(note().hidden, true);
  assert.equal(el.querySelector(".agentruns-edits-count").textContent, "5 edits · 2 undone");
});

test("an edit whose cell changed since is not undone: the server's words say why", async () => {
  const server = fakeServer({ e2: 409 });
  await shown();
  card("e2").querySelector(".agentruns-undo").click();
  await until(() => !note().hidden, { what: "the refusal said" });
  assert.equal(note().textContent, "Cannot undo “Edited cell 2”: the cell changed since the agent edited it");
  assert.deepEqual(server.posted, ["e2"]);
  assert.equal(card("e2").dataset.status, "applied");
  assert.equal(card("e2").querySelector(".agentruns-undo").disabled, false, "it can be tried again");
});

test("Undo all undoes the applied edits newest first and stops at the first conflict, saying so", async () => {
  const server = fakeServer({ e5: 200, e2: 409, e1: 200 });
  await shown();
  el.querySelector(".agentruns-undo-all").click();
  await until(() => !note().hidden && note().textContent !== "", { what: "Undo all's outcome said" });
  assert.deepEqual(server.posted, ["e5", "e2"], "e1 is older than the conflict: left as it is");
  assert.equal(
    note().textContent,
    "Undid 1 edit, then stopped at “Edited cell 2”: the cell changed since the agent edited it. 1 older edit stays applied.",
  );
  await until(() => card("e5").dataset.status === "undone");
  assert.equal(card("e1").dataset.status, "applied");
});

test("Undo all with every edit undoable undoes them all, one request each", async () => {
  const server = fakeServer({ e5: 200, e2: 200, e1: 200 });
  await shown();
  const all = el.querySelector(".agentruns-undo-all");
  all.click();
  all.click();
  await until(() => note().textContent === "Undid 3 edits.", { what: "Undo all done" });
  assert.deepEqual(server.posted, ["e5", "e2", "e1"]);
  await until(() => all.hidden, { what: "Undo all hidden: nothing is applied any more" });
});

test("Undo all's order and words, without a view", async () => {
  const edits = runEdits({ edits: [...structuredClone(EDITS), "not an edit", { op: "edit" }] });
  assert.deepEqual(undoOrder(edits).map((each) => each.edit_id), ["e5", "e2", "e1"]);
  const asked = [];
  const outcome = await undoAll(edits, async (each) => {
    asked.push(each.edit_id);
    return each.edit_id === "e5" ? "cannot reach the server." : null;
  });
  assert.deepEqual(asked, ["e5"]);
  assert.deepEqual({ ...outcome, stoppedAt: outcome.stoppedAt.edit_id }, { undone: 0, left: 3, stoppedAt: "e5", problem: "cannot reach the server." });
  assert.equal(undoAllWords(outcome), "Undo all stopped at “Ran cell 2”: cannot reach the server. 2 older edits stay applied.");
  assert.equal(undoAllWords({ undone: 0, left: 0, stoppedAt: null, problem: null }), "Nothing to undo.");
});

test("an edit's words and the text its diff compares", () => {
  assert.equal(editWords(edit("x", { op: "insert", index: null })), "Inserted a cell");
  assert.equal(editWords(edit("x", { op: "delete", status: "conflict" })), "Conflict: the cell changed; the deletion of cell 2 was not applied");
  assert.equal(sideText("edit", ["a = 1\n", "b = 2"]), "a = 1\nb = 2");
  const outputs = [
    { output_type: "execute_result", data: { "text/plain": "42", "text/html": "<b>42</b>" } },
    { output_type: "display_data", data: { "image/png": "iVBOR" } },
    { output_type: "error", ename: "ValueError", evalue: "bad" },
  ];
  assert.equal(sideText("outputs", outputs), "42\n[image/png]\nValueError: bad\n");
  assert.equal(sideText("edit", null), "");
});

test("an outputs edit says what running the cell showed: outputs counted, images counted, first lines", () => {
  const after = [
    { output_type: "stream", name: "stdout", text: ["rows: 3\n", "cols: 2\n"] },
    { output_type: "display_data", data: { "image/png": "iVBOR", "text/plain": "<Figure size 640x480>" }, metadata: {} },
    { output_type: "execute_result", data: { "text/plain": "42" }, metadata: {}, execution_count: 7 },
    { output_type: "error", ename: "ValueError", evalue: "x".repeat(300), traceback: [] },
  ];
  const { count, lines } = outputsSummary(edit("o", { op: "outputs", before: [], after }));
  assert.equal(count, "4 outputs · 1 image");
  assert.deepEqual(lines, ["rows: 3", "cols: 2", "42", "… 1 more line"]);
  assert.deepEqual(outputsSummary(edit("o", { op: "outputs", before: [], after: [] })), { count: "no output", lines: [] });
  const one = outputsSummary(edit("o", { op: "outputs", after: [{ output_type: "error", ename: "E", evalue: "y".repeat(200) }] }));
  assert.equal(one.count, "1 output");
  assert.equal(one.lines[0], `E: ${"y".repeat(117)}…`);
});

test("an outputs edit's card shows them above its diff, with Undo", () => {
  const after = [{ output_type: "stream", name: "stdout", text: "hello\n" }, { output_type: "display_data", data: { "image/png": "iVBOR" }, metadata: {} }];
  const card = editCard(edit("o", { op: "outputs", index: 0, before: [{ output_type: "stream", name: "stdout", text: "old\n" }], after }), () => {});
  assert.equal(card.querySelector(".agentruns-edit-words").textContent, "Ran cell 1");
  assert.equal(card.querySelector(".agentruns-edit-outputs-count").textContent, "Ran the cell: 2 outputs · 1 image");
  assert.equal(card.querySelector(".agentruns-edit-outputs-text").textContent, "hello");
  assert.match(card.querySelector(".agentruns-undo").title, /outputs the cell had before/);
  assert.ok(card.querySelector(".agentruns-edit-outputs").nextElementSibling.matches(".agentruns-diff"));
});
