// The anywidget module: every model is findable, every view follows its model's run.
import assert from "node:assert/strict";
import { test } from "node:test";

import { installPage, until } from "./dom.mjs";

installPage();
const { default: widget } = await import("../src/widget.js");
const { findModel } = await import("../src/models.js");

function fakeModel(traits) {
  const handlers = new Map();
  const model = {
    traits: { ...traits },
    get: (name) => model.traits[name],
    set: (name, value) => {
      model.traits[name] = value;
      for (const handler of handlers.get(`change:${name}`) || []) handler();
    },
    save_changes() {},
    on: (name, handler) => handlers.set(name, [...(handlers.get(name) || []), handler]),
    off: (name, handler) => handlers.set(name, (handlers.get(name) || []).filter((h) => h !== handler)),
  };
  return model;
}

test("initialize registers the model for the renderer; its cleanup unregisters it", () => {
  const model = fakeModel({ run_id: "run_w" });
  const cleanup = widget.initialize({ model });
  assert.equal(findModel("run_w"), model);
  cleanup();
  assert.equal(findModel("run_w"), null);
});

test("render shows the model's run, and the next one when run_id changes", async () => {
  globalThis.__jupyterAgentrunsHub = { register: () => () => {} };
  globalThis.fetch = async (url) => {
    const id = decodeURIComponent(new URL(url, "http://x").pathname.split("/").pop());
    return Response.json({
      run_id: id, agent: "demo", status: "succeeded", last_seq: 3, created_at: "2026-03-01T10:00:00Z",
      snapshot: { messages: [], tools: [], progress: null, usage: null }, output: 1,
    });
  };
  const model = fakeModel({ run_id: "run_one", base_url: "/" });
  const el = document.createElement("div");
  const cleanup = widget.render({ model, el });
  await until(() => el.querySelector(".agentruns-run").dataset.runId === "run_one" && el.querySelector(".agentruns-run").dataset.status === "succeeded");
  assert.equal(el.querySelector(".agentruns-run").dataset.runId, "run_one");
  model.set("run_id", "run_two");
  await until(() => el.querySelector(".agentruns-run").dataset.status === "succeeded" && el.querySelector(".agentruns-run").dataset.runId === "run_two");
  assert.equal(el.querySelector(".agentruns-run").dataset.runId, "run_two");
  cleanup();
  delete globalThis.__jupyterAgentrunsHub;
});
