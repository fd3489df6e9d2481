// JSON values off the wire.
import assert from "node:assert/strict";
import { test } from "node:test";

import { compactJson, isPlainObject, isSeq } from "../src/json.js";

test("plain objects are JSON objects only", () => {
  assert.equal(isPlainObject({}), true);
  assert.equal(isPlainObject([]), false);
  assert.equal(isPlainObject(null), false);
  assert.equal(isPlainObject("x"), false);
});

test("a seq is a non-negative safe integer", () => {
  assert.equal(isSeq(0), true);
  assert.equal(isSeq(7), true);
  for (const value of [-1, 1.5, "3", NaN, 2 ** 53, null]) assert.equal(isSeq(value), false, String(value));
});

test("compact JSON is cut with an ellipsis, and survives what JSON cannot say", () => {
  assert.equal(compactJson({ a: [1, 2] }, 100), '{"a":[1,2]}');
  assert.equal(compactJson("x".repeat(20), 10), `"${"x".repeat(8)}…`);
  assert.equal(compactJson(undefined, 10), "undefined");
  const cyclic = {};
  cyclic.self = cyclic;
  assert.equal(compactJson(cyclic, 40), "[object Object]");
});
