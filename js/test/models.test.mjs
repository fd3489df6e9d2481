// The page's widget models, found by run id across copies of the module.
import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";

import { findModel, registerModel, watchModels } from "../src/models.js";

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

beforeEach(() => {
  delete globalThis.__jupyterAgentrunsModels;
});

test("a registered model is found by its run id until it unregisters", () => {
  const model = fakeModel({ run_id: "run_a" });
  const unregister = registerModel(model);
  assert.equal(findModel("run_a"), model);
  assert.equal(findModel("run_b"), null);
  unregister();
  assert.equal(findModel("run_a"), null);
});

test("a model that moves to another run is found under the new id", () => {
  const model = fakeModel({ run_id: "run_a" });
  registerModel(model);
  model.set("run_id", "run_b");
  assert.equal(findModel("run_a"), null);
  assert.equal(findModel("run_b"), model);
});

test("watchers hear of models coming and going for their run", () => {
  const heard = [];
  const unwatch = watchModels("run_a", () => heard.push(findModel("run_a")));
  const model = fakeModel({ run_id: "run_a" });
  const unregister = registerModel(model);
  unregister();
  unwatch();
  registerModel(fakeModel({ run_id: "run_a" }));
  assert.deepEqual(heard, [model, null]);
});

test("two copies of the module share one registry", async () => {
  const copy = await import("../src/models.js?copy=1");
  const model = fakeModel({ run_id: "run_a" });
  copy.registerModel(model);
  assert.equal(findModel("run_a"), model);
});
