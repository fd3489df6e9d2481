// A link to a run's page: the run it names, and the address left once it is open.
import assert from "node:assert/strict";
import { test } from "node:test";

import { runInAddress } from "../src/links.js";

test("a link names its run, and the address keeps its other parameters", () => {
  assert.deepEqual(runInAddress("?agentruns-run=run_abc"), { runId: "run_abc", rest: "" });
  assert.deepEqual(runInAddress("?reset&agentruns-run=run_abc&x=1"), { runId: "run_abc", rest: "?reset&x=1" });
  assert.deepEqual(runInAddress("agentruns-run=run_%2Fa"), { runId: "run_/a", rest: "" });
});

test("an address without a run, or with an empty one, opens none", () => {
  assert.deepEqual(runInAddress(""), { runId: null, rest: "" });
  assert.deepEqual(runInAddress("?token=t"), { runId: null, rest: "?token=t" });
  assert.deepEqual(runInAddress("?agentruns-run="), { runId: null, rest: "" });
});
