// The mark on a cell an agent wrote: what it reads from the cell, what it says, and the agents it asks for.
import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";

import { installPage } from "./dom.mjs";

installPage();
const { AgentNames, MARK_NAME_CHARS, cellStamp, markLabel, markNode, markTitle, showAgent } = await import("../src/provenance.js");

beforeEach(() => installPage());

test("a cell's stamp is its run and edit; anything else is no stamp", () => {
  assert.deepEqual(cellStamp({ agentruns: { run_id: "run_1", edit_id: "ed_2" } }), { runId: "run_1", editId: "ed_2" });
  assert.deepEqual(cellStamp({ agentruns: { run_id: "run_1" } }), { runId: "run_1", editId: null });
  for (const metadata of [undefined, null, {}, { agentruns: null }, { agentruns: "run_1" }, { agentruns: { run_id: "" } }, { agentruns: { run_id: 7 } }, []]) {
    assert.equal(cellStamp(metadata), null, JSON.stringify(metadata));
  }
});

test("a mark names the agent, cut when long, and its title says the run, the edit and what a click does", () => {
  assert.equal(markLabel("opencode"), "opencode");
  assert.equal(markLabel(null), "agent");
  const long = "a".repeat(40);
  assert.equal(markLabel(long), `${"a".repeat(MARK_NAME_CHARS - 1)}…`);
  const stamp = { runId: "run_1", editId: "ed_2" };
  assert.equal(markTitle(stamp, "opencode", true), "Written by the agent opencode: run run_1, edit ed_2. Open the run's page.");
  assert.equal(markTitle({ runId: "run_1", editId: null }, null, false), "Written by an agent: run run_1.");
});

test("a mark is a button where run pages open: a click asks for the run, and the cell does not see it", () => {
  /** @type {string[]} */
  const opened = [];
  const stamp = { runId: "run_1", editId: "ed_2" };
  const mark = markNode(stamp, (runId) => opened.push(runId));
  const cell = document.createElement("div");
  let cellClicks = 0;
  cell.addEventListener("click", () => (cellClicks += 1));
  cell.append(mark);
  document.body.append(cell);
  assert.equal(mark.tagName, "BUTTON");
  assert.equal(mark.getAttribute("data-lm-suppress-shortcuts"), "true");
  assert.equal(mark.textContent, "✦agent");
  showAgent(mark, stamp, "opencode");
  assert.equal(mark.textContent, "✦opencode");
  assert.equal(mark.dataset.agent, "opencode");
  assert.equal(mark.getAttribute("aria-label"), "Written by the agent opencode: run run_1, edit ed_2. Open the run's page.");
  mark.click();
  assert.deepEqual(opened, ["run_1"]);
  assert.equal(cellClicks, 0);
  // Without run pages (Notebook 7) it only says who wrote the cell.
  const plain = markNode(stamp, null);
  assert.equal(plain.tagName, "SPAN");
  assert.equal(plain.title, "Written by an agent: run run_1, edit ed_2.");
});

test("the agent of a run is read once, a run the server refuses too; a server out of reach is asked again", async () => {
  /** @type {string[]} */
  const asked = [];
  let reachable = false;
  globalThis.fetch = async (url) => {
    const path = new URL(url, "http://localhost").pathname;
    asked.push(path);
    if (path.endsWith("/run_gone")) return Response.json({ error: "run_not_found", message: "no such run" }, { status: 404 });
    if (!reachable) throw new TypeError("Failed to fetch");
    return Response.json({ run_id: "run_1", agent: "opencode", status: "succeeded" });
  };
  const names = new AgentNames({ baseUrl: "/" });
  assert.equal(await names.agent("run_1"), null);
  reachable = true;
  const [first, second] = await Promise.all([names.agent("run_1"), names.agent("run_1")]);
  assert.deepEqual([first, second], ["opencode", "opencode"]);
  assert.equal(await names.agent("run_1"), "opencode");
  assert.equal(await names.agent("run_gone"), null);
  assert.equal(await names.agent("run_gone"), null);
  assert.deepEqual(asked, ["/api/agentruns/runs/run_1", "/api/agentruns/runs/run_1", "/api/agentruns/runs/run_gone"]);
});
