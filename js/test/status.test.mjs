// Which statuses are terminal, which still need following.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { ACTIVE_STATUSES, STATUSES, TERMINAL_TYPES, isTerminal, isTerminalType } from "../src/status.js";

test("the four terminal statuses, and nothing else, are terminal", () => {
  assert.deepEqual(Object.values(TERMINAL_TYPES).sort(), ["cancelled", "failed", "interrupted", "succeeded"]);
  for (const status of Object.values(TERMINAL_TYPES)) assert.equal(isTerminal(status), true);
  for (const status of [...ACTIVE_STATUSES, "", "toString", undefined, null]) assert.equal(isTerminal(status), false);
});

test("terminal event types are recognised by name only", () => {
  assert.equal(isTerminalType("run.cancelled"), true);
  assert.equal(isTerminalType("run.cancel_requested"), false);
  assert.equal(isTerminalType("constructor"), false);
});

test("a run waiting for a person is still active", () => {
  assert.ok(ACTIVE_STATUSES.has("waiting"));
});

test("the statuses are the shared ones, as jupyter_agentruns/lifecycle.py has them", () => {
  const shared = JSON.parse(
    readFileSync(new URL("../../tests/vectors/lifecycle/statuses.json", import.meta.url), "utf8")
  );
  assert.deepEqual([...STATUSES], shared.statuses);
  assert.deepEqual([...ACTIVE_STATUSES].sort(), shared.active);
  assert.deepEqual({ ...TERMINAL_TYPES }, shared.terminal_events);
  for (const status of shared.terminal) assert.equal(isTerminal(status), true);
});
