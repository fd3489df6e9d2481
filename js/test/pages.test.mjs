// The page's side of agents' notebook edits: changes made on a real shared
// notebook model (@jupyter/ydoc's YNotebook, as JupyterLab's), and the link's
// messages, over a WebSocket the test plays the server of.
import assert from "node:assert/strict";
import { test } from "node:test";

import { YNotebook } from "@jupyter/ydoc";

import { PageLink, UNAVAILABLE, linkUrl, makeChange, workOf } from "../src/pages.js";

/**
 * A notebook model as a page holds it: c-2 changed by the person and not saved.
 * Disposed after the test `t`, passed or failed (a live model keeps node running).
 */
function openNotebook(t) {
  const notebook = new YNotebook();
  t.after(() => notebook.dispose());
  notebook.insertCells(0, [
    { cell_type: "code", id: "c-1", source: "x = 1", metadata: {} },
    { cell_type: "code", id: "c-2", source: "print(x)  # mine", metadata: { tags: ["keep"] } },
    { cell_type: "markdown", id: "c-3", source: "# notes", metadata: {} },
  ]);
  return notebook;
}

const cells = (notebook) => notebook.toJSON().cells.map((cell) => [cell.id, cell.source]);
const stamped = (id, source, extra = {}) => ({
  cell_type: "code",
  id,
  source,
  metadata: { agentruns: { run_id: "run_1", edit_id: "ed_1" } },
  outputs: [],
  execution_count: null,
  ...extra,
});

test("an insert goes after the cell it was read after, with its id and stamp", (t) => {
  const notebook = openNotebook(t);
  assert.equal(makeChange(notebook, { kind: "insert", index: 1, after: "c-1", cell: stamped("new", "y = 2") }), null);
  assert.deepEqual(cells(notebook), [["c-1", "x = 1"], ["new", "y = 2"], ["c-2", "print(x)  # mine"], ["c-3", "# notes"]]);
  assert.deepEqual(notebook.toJSON().cells[1].metadata, { agentruns: { run_id: "run_1", edit_id: "ed_1" } });
  assert.equal(makeChange(notebook, { kind: "insert", index: 0, after: null, cell: stamped("top", "import os") }), null);
  assert.equal(cells(notebook)[0][0], "top");
});

test("an insert whose cell is gone, or whose id is taken, changes nothing", (t) => {
  const notebook = openNotebook(t);
  const before = cells(notebook);
  assert.match(makeChange(notebook, { kind: "insert", index: 1, after: "gone", cell: stamped("new", "y") }), /gone/);
  assert.match(makeChange(notebook, { kind: "insert", index: 1, after: "c-1", cell: stamped("c-3", "y") }), /already/);
  assert.deepEqual(cells(notebook), before);
});

test("a replace changes its cell's source and metadata and leaves the person's other cells as they are", (t) => {
  const notebook = openNotebook(t);
  const change = { kind: "replace", source: "x = 1", cell: stamped("c-1", "x = 10") };
  assert.equal(makeChange(notebook, change), null);
  assert.deepEqual(cells(notebook), [["c-1", "x = 10"], ["c-2", "print(x)  # mine"], ["c-3", "# notes"]]);
  assert.equal(notebook.toJSON().cells[0].metadata.agentruns.edit_id, "ed_1");
  assert.deepEqual(notebook.toJSON().cells[1].metadata, { tags: ["keep"] });
});

test("a replace whose cell has lost a metadata key (an undo's stamp) takes it out of the page's cell", (t) => {
  const notebook = openNotebook(t);
  assert.equal(makeChange(notebook, { kind: "replace", source: "x = 1", cell: stamped("c-1", "x = 10") }), null);
  const undone = { cell_type: "code", id: "c-1", source: "x = 1", metadata: {}, outputs: [], execution_count: null };
  assert.equal(makeChange(notebook, { kind: "replace", source: "x = 10", cell: undone }), null);
  assert.deepEqual(notebook.toJSON().cells[0].metadata, {});
  assert.deepEqual(cells(notebook)[0], ["c-1", "x = 1"]);
});

test("a replace carries outputs and the execution count of a code cell", (t) => {
  const notebook = openNotebook(t);
  const outputs = [{ output_type: "stream", name: "stdout", text: "1\n" }];
  const change = { kind: "replace", source: "x = 1", cell: stamped("c-1", "x = 1", { outputs, execution_count: 3 }) };
  assert.equal(makeChange(notebook, change), null);
  const cell = notebook.toJSON().cells[0];
  assert.deepEqual([cell.outputs, cell.execution_count], [outputs, 3]);
});

test("a replace or delete of a cell the person changed since it was read changes nothing", (t) => {
  const notebook = openNotebook(t);
  const before = JSON.stringify(notebook.toJSON());
  const read = "print(x)"; // what the server read, before the person's unsaved change
  assert.match(makeChange(notebook, { kind: "replace", source: read, cell: stamped("c-2", "agent") }), /changed in the page/);
  assert.match(makeChange(notebook, { kind: "delete", cell_id: "c-2", source: read }), /changed in the page/);
  assert.match(makeChange(notebook, { kind: "delete", cell_id: "gone", source: "" }), /gone/);
  const typed = { kind: "replace", source: "# notes", cell: stamped("c-3", "# notes!") };
  assert.match(makeChange(notebook, typed), /markdown cell now/);
  assert.equal(JSON.stringify(notebook.toJSON()), before);
});

test("a delete takes out the cell by id, wherever it is now", (t) => {
  const notebook = openNotebook(t);
  notebook.insertCell(0, { cell_type: "code", id: "typed", source: "new above", metadata: {} });
  assert.equal(makeChange(notebook, { kind: "delete", cell_id: "c-3", source: "# notes" }), null);
  assert.deepEqual(cells(notebook).map(([id]) => id), ["typed", "c-1", "c-2"]);
});

test("the link's URL is the API's under the base URL, over ws or wss as the page", () => {
  assert.equal(linkUrl("/user/ann/", "https://hub.example/user/ann/lab"), "wss://hub.example/user/ann/api/agentruns/pages");
  assert.equal(linkUrl("/", "http://127.0.0.1:8888/lab/tree/a.ipynb"), "ws://127.0.0.1:8888/api/agentruns/pages");
});

/** A WebSocket whose server is the test: it records what the page sends. */
function fakeSockets() {
  const sockets = [];
  class Socket {
    constructor(url) {
      this.url = url;
      this.readyState = 0;
      this.sent = [];
      sockets.push(this);
    }
    send(text) {
      this.sent.push(JSON.parse(text));
    }
    close() {
      this.drop(1000);
    }
    open() {
      this.readyState = 1;
      this.onopen({});
    }
    drop(code) {
      this.readyState = 3;
      this.onclose({ code });
    }
    async hear(message) {
      await this.onmessage({ data: JSON.stringify(message) });
    }
  }
  return { sockets, Socket };
}

/** What a page holds: one notebook, its model real, saving counted. */
function pageNotebooks(t, path = "work/a.ipynb") {
  const notebook = openNotebook(t);
  const held = {
    notebook,
    saves: 0,
    failSave: false,
    paths: () => [path],
    read: (asked) => (asked === path ? notebook.toJSON() : null),
    make: (_, change) => makeChange(notebook, change),
    async save() {
      if (held.failSave) throw new Error("disk full");
      held.saves += 1;
    },
  };
  return held;
}

function linked(t, held = pageNotebooks(t)) {
  const { sockets, Socket } = fakeSockets();
  const timers = [];
  const link = new PageLink({
    url: "ws://x/api/agentruns/pages",
    notebooks: held,
    WebSocket: /** @type {any} */ (Socket),
    setTimeout: (callback, ms) => timers.push({ callback, ms }),
    random: () => 0,
    warn: () => undefined,
  });
  link.start();
  sockets[0].open();
  return { link, held, sockets, timers, socket: sockets[0] };
}

test("the page says which notebooks it has open, and gives a notebook as its model holds it", async (t) => {
  const { socket } = linked(t);
  assert.deepEqual(socket.sent, [{ type: "open", notebooks: ["work/a.ipynb"] }]);
  await socket.hear({ type: "read", request: "r1", notebook: "work/a.ipynb" });
  await socket.hear({ type: "read", request: "r2", notebook: "work/other.ipynb" });
  const [, content, none] = socket.sent;
  assert.equal(content.request, "r1");
  assert.equal(content.content.cells[1].source, "print(x)  # mine");
  assert.deepEqual(none, { type: "content", request: "r2", content: null });
});

test("a change is claimed first, made only once claimed, then saved and answered", async (t) => {
  const { socket, held } = linked(t);
  const change = { kind: "insert", index: 3, after: "c-3", cell: stamped("new", "y") };
  await socket.hear({ type: "make", claim: "t1", notebook: "work/a.ipynb", change });
  assert.deepEqual(socket.sent.at(-1), { type: "claim", claim: "t1" });
  assert.equal(cells(held.notebook).length, 3); // not before the server says it is this page's
  await socket.hear({ type: "claimed", claim: "t1" });
  assert.deepEqual(cells(held.notebook).at(-1), ["new", "y"]);
  assert.equal(held.saves, 1);
  assert.deepEqual(socket.sent.at(-1), { type: "made", claim: "t1", ok: true });
});

test("a refused claim, or a change of a notebook the page does not hold, is never made", async (t) => {
  const { socket, held } = linked(t);
  const change = { kind: "insert", index: 0, after: null, cell: stamped("new", "y") };
  await socket.hear({ type: "make", claim: "t1", notebook: "work/a.ipynb", change });
  await socket.hear({ type: "refused", claim: "t1", error: "claim_taken", message: "another page" });
  await socket.hear({ type: "claimed", claim: "t1" }); // never: but even so, nothing is left to make
  await socket.hear({ type: "make", claim: "t2", notebook: "work/closed.ipynb", change });
  assert.deepEqual(cells(held.notebook).map(([id]) => id), ["c-1", "c-2", "c-3"]);
  assert.equal(held.saves, 0);
  assert.deepEqual(socket.sent.map((message) => message.type), ["open", "claim"]);
});

test("a change that does not fit, or a save that fails, is answered with why", async (t) => {
  const { socket, held } = linked(t);
  const stale = { kind: "replace", source: "print(x)", cell: stamped("c-2", "agent") };
  await socket.hear({ type: "make", claim: "t1", notebook: "work/a.ipynb", change: stale });
  await socket.hear({ type: "claimed", claim: "t1" });
  const refused = socket.sent.at(-1);
  assert.equal(refused.ok, false);
  assert.match(refused.reason, /changed in the page/);
  held.failSave = true;
  const fits = { kind: "insert", index: 0, after: null, cell: stamped("new", "y") };
  await socket.hear({ type: "make", claim: "t2", notebook: "work/a.ipynb", change: fits });
  await socket.hear({ type: "claimed", claim: "t2" });
  assert.deepEqual(socket.sent.at(-1), {
    type: "made",
    claim: "t2",
    ok: false,
    reason: "the page made it but could not save: Error: disk full",
  });
});

test("as its link comes up, and told its file changed, the page reads the notebook again; a read that fails answers null", async (t) => {
  const held = pageNotebooks(t);
  const told = [];
  held.saved = async (path) => void told.push(path);
  const { socket } = linked(t, held);
  await Promise.resolve();
  assert.deepEqual(told, ["work/a.ipynb"], "checked as the link comes up");
  await socket.hear({ type: "saved", notebook: "work/a.ipynb" });
  assert.deepEqual(told, ["work/a.ipynb", "work/a.ipynb"]);
  assert.deepEqual(socket.sent.map((message) => message.type), ["open"]); // nothing to answer
  held.read = async () => {
    throw new Error("the contents service is down");
  };
  await socket.hear({ type: "read", request: "r1", notebook: "work/a.ipynb" });
  assert.deepEqual(socket.sent.at(-1), { type: "content", request: "r1", content: null });
});

test("a notebook's work is its cells' ids, types, sources and outputs: not metadata a kernel writes", () => {
  const cell = { id: "c-1", cell_type: "code", source: ["x = ", "1"], outputs: [], metadata: {} };
  const notebook = { metadata: {}, cells: [cell] };
  const work = workOf(notebook);
  assert.equal(workOf({ metadata: { language_info: { name: "python" } }, cells: [{ ...cell, source: "x = 1", metadata: { trusted: true } }] }), work);
  assert.notEqual(workOf({ cells: [{ ...cell, source: "x = 2" }] }), work);
  assert.notEqual(workOf({ cells: [{ ...cell, outputs: [{ output_type: "stream", name: "stdout", text: "1" }] }] }), work);
  assert.notEqual(workOf({ cells: [cell, { ...cell, id: "c-2" }] }), work);
});

test("a dropped link comes back with backoff and says its notebooks again; a server without the tools is left alone", (t) => {
  const { sockets, timers, link } = linked(t);
  sockets[0].drop(1006);
  assert.equal(timers.length, 1);
  assert.ok(timers[0].ms >= 1000);
  timers[0].callback();
  sockets[1].open();
  assert.deepEqual(sockets[1].sent, [{ type: "open", notebooks: ["work/a.ipynb"] }]);
  sockets[1].drop(UNAVAILABLE);
  assert.equal(timers.length, 1);
  assert.equal(link.stopped, true);
});
