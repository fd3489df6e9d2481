// The JS reducer is held to the same vectors as jupyter_agentruns/reducer.py.
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { test } from "node:test";

import { applyEvent, emptySnapshot, reduceEvents } from "../src/reducer.js";

const vectors = new URL("../../tests/vectors/", import.meta.url);
const files = readdirSync(vectors).filter((name) => name.endsWith(".json")).sort();

test("there are vectors to check", () => {
  assert.ok(files.length > 0);
});

for (const name of files) {
  const vector = JSON.parse(readFileSync(new URL(name, vectors), "utf8"));
  test(`vector ${name}: ${vector.description}`, () => {
    assert.deepStrictEqual(reduceEvents(vector.events), vector.snapshot);
  });

  test(`vector ${name} reduced in two halves gives the same snapshot`, () => {
    const half = Math.floor(vector.events.length / 2);
    const first = reduceEvents(vector.events.slice(0, half));
    assert.deepStrictEqual(reduceEvents(vector.events.slice(half), first), vector.snapshot);
  });
}

test("reduceEvents leaves the snapshot it starts from untouched", () => {
  const start = emptySnapshot();
  reduceEvents([{ type: "message.started", data: { message_id: "m1" } }], start);
  assert.deepStrictEqual(start, emptySnapshot());
});

test("a message started without a role is the assistant's", () => {
  const snapshot = applyEvent(emptySnapshot(), { type: "message.started", data: { message_id: "m1" } });
  assert.deepStrictEqual(snapshot.messages, [{ id: "m1", role: "assistant", text: "", done: false }]);
});

test("a tool completed without ok counts as completed, like the Python reducer", () => {
  const snapshot = reduceEvents([
    { type: "tool.started", data: { call_id: "c1", name: "t" } },
    { type: "tool.completed", data: { call_id: "c1", result: 3 } },
  ]);
  assert.deepStrictEqual(snapshot.tools, [{ call_id: "c1", name: "t", args: {}, status: "completed", result: 3 }]);
});

test("a tool failed without an error still gets an error key", () => {
  const snapshot = reduceEvents([
    { type: "tool.started", data: { call_id: "c1", name: "t", args: { a: 1 } } },
    { type: "tool.completed", data: { call_id: "c1", ok: false } },
  ]);
  assert.deepStrictEqual(snapshot.tools[0], {
    call_id: "c1", name: "t", args: { a: 1 }, status: "failed", result: null, error: null,
  });
});

test("completing or ending an unknown message or tool changes nothing", () => {
  const snapshot = reduceEvents([
    { type: "message.completed", data: { message_id: "nope" } },
    { type: "tool.completed", data: { call_id: "nope", ok: true } },
  ]);
  assert.deepStrictEqual(snapshot, emptySnapshot());
});

test("an event missing a field the reducer needs is an error, as in Python", () => {
  assert.throws(() => applyEvent(emptySnapshot(), { type: "text.delta", data: { delta: "x" } }), TypeError);
  assert.throws(() => applyEvent(emptySnapshot(), { type: "tool.started", data: { call_id: "c" } }), TypeError);
});
