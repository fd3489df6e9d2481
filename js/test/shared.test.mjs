// Outputs of a shared notebook: a page asks before it changes one, since every page would.
import assert from "node:assert/strict";
import { test } from "node:test";
import { installPage } from "./dom.mjs";

installPage();
const { inSharedNotebook, markShared, writesOutputs } = await import("../src/shared.js");
const copy = await import("../src/shared.js?copy=renderer");

test("an output inside a panel marked shared is in a shared notebook, for every copy of the module", () => {
  const panel = document.createElement("div");
  const output = document.createElement("div");
  panel.append(output);
  document.body.append(panel);
  const other = document.createElement("div");
  document.body.append(other);
  assert.equal(inSharedNotebook(output), false);
  markShared(panel);
  assert.equal(inSharedNotebook(output), true);
  assert.equal(copy.inSharedNotebook(output), true, "the renderer's copy sees the plugin's marks");
  assert.equal(inSharedNotebook(other), false);
  assert.equal(inSharedNotebook(null), false);
});

test("of the pages holding a shared notebook, the one of the lowest client id writes its outputs", () => {
  const panel = document.createElement("div");
  const output = document.createElement("div");
  panel.append(output);
  document.body.append(panel);
  assert.equal(writesOutputs(output), true, "a notebook not shared: this page");
  assert.equal(writesOutputs(output, true), true, "not shared: this page, beside its kernel");
  /** @param {number} me @param {Array<[number, Record<string, any>]>} states */
  const awareness = (me, states) => ({ clientID: me, getStates: () => new Map(states) });
  const user = { user: { name: "Ada" } };
  markShared(panel, awareness(7, [[7, user], [9, user], [3, {}]]));
  assert.equal(writesOutputs(output), true, "the lowest of the pages (the server's state has no user)");
  assert.equal(writesOutputs(output, true), false, "the kernel alive: it updates the output, not a page");
  markShared(panel, awareness(9, [[7, user], [9, user]]));
  assert.equal(writesOutputs(output), false);
  assert.equal(copy.writesOutputs(output), false, "the renderer's copy sees the same");
  markShared(panel, awareness(7, [[9, user]]));
  assert.equal(writesOutputs(output), false, "its own state not known yet: left to the others");
  markShared(panel, null);
  assert.equal(writesOutputs(output), false, "no awareness: left to the others");
});
