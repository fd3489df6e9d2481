// Outputs of a shared notebook: a page asks before it changes one, since every page would.
import assert from "node:assert/strict";
import { test } from "node:test";
import { installPage } from "./dom.mjs";

installPage();
const { inSharedNotebook, markShared } = await import("../src/shared.js");
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
