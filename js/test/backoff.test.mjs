// Reconnect delays: exponential, jittered, capped.
import assert from "node:assert/strict";
import { test } from "node:test";

import { backoffDelay } from "../src/backoff.js";

test("backoff stays between the floor and a doubling ceiling capped at 30 s", () => {
  assert.equal(backoffDelay(1, 1000, () => 0), 1000);
  assert.equal(backoffDelay(1, 1000, () => 1), 2000);
  assert.equal(backoffDelay(3, 1000, () => 0.5), 4500);
  assert.equal(backoffDelay(20, 1000, () => 1), 30000);
  assert.equal(backoffDelay(1, 45000, () => 1), 45000, "a floor above the cap wins");
});
