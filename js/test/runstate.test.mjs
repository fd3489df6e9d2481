// The client reducer: de-duplication, gaps, guards and the run's status.
import assert from "node:assert/strict";
import { test } from "node:test";

import { emptySnapshot } from "../src/reducer.js";
import { MAX_DELTA_BYTES, MAX_TEXT_BYTES, MAX_UNKNOWN_EVENTS, RunState } from "../src/runstate.js";

const RUN = "run_abc";
const TS = "2026-01-01T00:00:00.000Z";

function envelope(seq, type, data = {}) {
  return { run_id: RUN, seq, type, ts: TS, data };
}

function runObject(fields = {}) {
  return {
    run_id: RUN, agent: "demo", status: "running", session: null, metadata: {}, input: {},
    retry_of: null, created_at: TS, started_at: TS, finished_at: null, last_seq: 0, first_seq: 1,
    snapshot: emptySnapshot(), output: null, error: null, cancel: null, ...fields,
  };
}

function started() {
  const state = new RunState(RUN);
  assert.equal(state.applyEnvelope(envelope(1, "run.started")), "applied");
  assert.equal(state.applyEnvelope(envelope(2, "message.started", { message_id: "m1", role: "assistant" })), "applied");
  return state;
}

test("an event seen twice is applied once", () => {
  const state = started();
  assert.equal(state.applyEnvelope(envelope(3, "text.delta", { message_id: "m1", delta: "Hi" })), "applied");
  assert.equal(state.applyEnvelope(envelope(3, "text.delta", { message_id: "m1", delta: "Hi" })), "duplicate");
  assert.equal(state.applyEnvelope(envelope(1, "run.started")), "duplicate");
  assert.equal(state.snapshot.messages[0].text, "Hi");
  assert.equal(state.lastSeq, 3);
});

test("a hole in seq is reported as a gap and nothing is applied", () => {
  const state = started();
  assert.equal(state.applyEnvelope(envelope(5, "text.delta", { message_id: "m1", delta: "late" })), "gap");
  assert.equal(state.lastSeq, 2);
  assert.equal(state.snapshot.messages[0].text, "");
  assert.equal(state.applyEnvelope(envelope(3, "text.delta", { message_id: "m1", delta: "on time" })), "applied");
});

test("a loaded run renders its snapshot and continues from its last_seq", () => {
  const state = new RunState(RUN);
  const snapshot = { ...emptySnapshot(), messages: [{ id: "m1", role: "assistant", text: "Hel", done: false }] };
  const run = runObject({ last_seq: 7, snapshot });
  assert.equal(state.loadRun(run), "loaded");
  assert.equal(state.lastSeq, 7);
  assert.equal(state.status, "running");
  assert.equal(state.run, run);
  assert.equal(state.applyEnvelope(envelope(7, "text.delta", { message_id: "m1", delta: "Hel" })), "duplicate");
  assert.equal(state.applyEnvelope(envelope(8, "text.delta", { message_id: "m1", delta: "lo" })), "applied");
  assert.equal(state.snapshot.messages[0].text, "Hello");
  assert.equal(run.snapshot.messages[0].text, "Hel", "the run object is not mutated");
});

test("loading a run after a gap repairs the view", () => {
  const state = started();
  assert.equal(state.applyEnvelope(envelope(9, "run.succeeded", { output: 1 })), "gap");
  const snapshot = { ...emptySnapshot(), messages: [{ id: "m1", role: "assistant", text: "all", done: true }] };
  assert.equal(state.loadRun(runObject({ status: "succeeded", last_seq: 9, snapshot, output: 1 })), "loaded");
  assert.equal(state.status, "succeeded");
  assert.equal(state.terminal, true);
  assert.equal(state.output, 1);
  assert.equal(state.snapshot.messages[0].text, "all");
});

test("a delta over 64 KiB is a protocol error, not text", () => {
  const state = started();
  const result = state.applyEnvelope(envelope(3, "text.delta", { message_id: "m1", delta: "x".repeat(MAX_DELTA_BYTES + 1) }));
  assert.equal(result, "protocol_error");
  assert.match(state.problem, /text\.delta/);
  assert.equal(state.snapshot.messages[0].text, "");
  assert.equal(state.applyEnvelope(envelope(3, "text.delta", { message_id: "m1", delta: "ok" })), "protocol_error");
});

test("a delta is measured in UTF-8 bytes", () => {
  const state = started();
  const threeBytes = "€".repeat(Math.floor(MAX_DELTA_BYTES / 3) + 1); // fewer chars than the limit, more bytes
  assert.equal(state.applyEnvelope(envelope(3, "text.delta", { message_id: "m1", delta: threeBytes })), "protocol_error");
});

test("text growing over 8 MB is a protocol error", () => {
  const state = new RunState(RUN);
  const snapshot = { ...emptySnapshot(), messages: [{ id: "m1", role: "assistant", text: "x".repeat(MAX_TEXT_BYTES - 10), done: false }] };
  assert.equal(state.loadRun(runObject({ last_seq: 5, snapshot })), "loaded");
  assert.equal(state.applyEnvelope(envelope(6, "text.delta", { message_id: "m1", delta: "x".repeat(10) })), "applied");
  assert.equal(state.applyEnvelope(envelope(7, "text.delta", { message_id: "m1", delta: "x" })), "protocol_error");
  assert.match(state.problem, /over/);
});

test("a run object with too much text is refused", () => {
  const state = new RunState(RUN);
  const snapshot = { ...emptySnapshot(), messages: [{ id: "m1", role: "assistant", text: "x".repeat(MAX_TEXT_BYTES + 1), done: false }] };
  assert.equal(state.loadRun(runObject({ last_seq: 5, snapshot })), "protocol_error");
});

const malformed = {
  "not an object": "nope",
  "null": null,
  "another run's event": { ...envelope(3, "progress"), run_id: "run_other" },
  "no seq": { run_id: RUN, type: "progress", ts: TS, data: {} },
  "a seq that is text": { ...envelope(3, "progress"), seq: "3" },
  "a fractional seq": { ...envelope(3, "progress"), seq: 3.5 },
  "seq zero": envelope(0, "progress"),
  "no type": { run_id: RUN, seq: 3, ts: TS, data: {} },
  "no ts": { run_id: RUN, seq: 3, type: "progress", data: {} },
  "data that is a list": envelope(3, "x.thing", [1, 2]),
  "no data": { run_id: RUN, seq: 3, type: "progress", ts: TS },
  "a delta without message_id": envelope(3, "text.delta", { delta: "x" }),
  "a delta that is a number": envelope(3, "text.delta", { message_id: "m1", delta: 5 }),
  "a tool without a name": envelope(3, "tool.started", { call_id: "c1" }),
};

for (const [what, bad] of Object.entries(malformed)) {
  test(`a malformed envelope (${what}) is a protocol error`, () => {
    const state = started();
    assert.equal(state.applyEnvelope(bad), "protocol_error");
    assert.equal(typeof state.problem, "string");
    assert.equal(state.lastSeq, 2);
  });
}

test("a run object for another run, or without a snapshot, is refused", () => {
  assert.equal(new RunState(RUN).loadRun(runObject({ run_id: "run_other" })), "protocol_error");
  assert.equal(new RunState(RUN).loadRun(runObject({ snapshot: null })), "protocol_error");
  assert.equal(new RunState(RUN).loadRun(runObject({ last_seq: -1 })), "protocol_error");
  assert.equal(new RunState(RUN).loadRun(undefined), "protocol_error");
});

test("loading a run clears an earlier protocol error", () => {
  const state = started();
  assert.equal(state.applyEnvelope("garbage"), "protocol_error");
  assert.equal(state.loadRun(runObject({ last_seq: 2 })), "loaded");
  assert.equal(state.problem, null);
  assert.equal(state.applyEnvelope(envelope(3, "run.started")), "applied");
});

test("unknown event types are kept, the last 20 only, and leave the snapshot alone", () => {
  const state = started();
  const before = structuredClone(state.snapshot);
  for (let seq = 3; seq < 3 + MAX_UNKNOWN_EVENTS + 5; seq++) {
    assert.equal(state.applyEnvelope(envelope(seq, "x.chart", { n: seq })), "applied");
  }
  assert.equal(state.unknown.length, MAX_UNKNOWN_EVENTS);
  assert.deepEqual(state.unknown.at(-1), { seq: 27, type: "x.chart", data: { n: 27 } });
  assert.equal(state.unknown[0].seq, 8);
  assert.deepEqual(state.snapshot, before);
  assert.equal(state.lastSeq, 27);
});

test("lifecycle events are not kept as unknown", () => {
  const state = started();
  state.applyEnvelope(envelope(3, "usage", { input_tokens: 1, output_tokens: 2 }));
  state.applyEnvelope(envelope(4, "run.cancel_requested", { reason: "stop" }));
  assert.deepEqual(state.unknown, []);
});

test("notebook edits are the edits section's, not unknown events to list", () => {
  const state = started();
  const data = { edit_id: "e1", notebook: "a.ipynb", op: "edit", cell_id: "c1", index: 0, before: "1", after: "2", status: "applied" };
  assert.equal(state.applyEnvelope(envelope(3, "notebook.edit", data)), "applied");
  assert.deepEqual(state.unknown, []);
});

test("thinking and plans are the snapshot's, not unknown events to list", () => {
  const state = started();
  assert.equal(state.applyEnvelope(envelope(3, "reasoning.delta", { message_id: "m1", delta: "Look first." })), "applied");
  assert.equal(state.applyEnvelope(envelope(4, "plan.updated", { entries: [{ content: "Read", status: "pending" }] })), "applied");
  assert.deepEqual(state.unknown, []);
  assert.equal(state.snapshot.reasoning, "Look first.");
  assert.deepEqual(state.snapshot.plan, [{ content: "Read", status: "pending" }]);
  assert.equal(state.textBytes, 0, "thinking is not the answer's text");
});

test("thinking is held to the limits of text: a delta over 64 KiB, a whole over 8 MB, a delta that is no text", () => {
  let state = started();
  assert.equal(state.applyEnvelope(envelope(3, "reasoning.delta", { message_id: "m1", delta: "x".repeat(MAX_DELTA_BYTES + 1) })), "protocol_error");
  assert.match(state.problem, /reasoning\.delta/);
  assert.equal(state.snapshot.reasoning, undefined);

  state = new RunState(RUN);
  const snapshot = { ...emptySnapshot(), reasoning: "x".repeat(MAX_TEXT_BYTES - 10) };
  assert.equal(state.loadRun(runObject({ last_seq: 5, snapshot })), "loaded");
  assert.equal(state.applyEnvelope(envelope(6, "reasoning.delta", { message_id: "m1", delta: "x".repeat(10) })), "applied");
  assert.equal(state.applyEnvelope(envelope(7, "reasoning.delta", { message_id: "m1", delta: "x" })), "protocol_error");
  assert.match(state.problem, /thinking grew over/);

  snapshot.reasoning += "x".repeat(11);
  assert.equal(new RunState(RUN).loadRun(runObject({ last_seq: 5, snapshot })), "protocol_error");

  state = started();
  assert.equal(state.applyEnvelope(envelope(3, "reasoning.delta", { message_id: "m1", delta: 5 })), "protocol_error");
});

test("a new run is queued, then running once started", () => {
  const state = new RunState(RUN);
  assert.equal(state.status, "queued");
  state.applyEnvelope(envelope(1, "run.started"));
  assert.equal(state.status, "running");
  assert.equal(state.terminal, false);
});

test("run.succeeded ends the run with its output", () => {
  const state = started();
  state.applyEnvelope(envelope(3, "run.succeeded", { output: { text: "done" } }));
  assert.equal(state.status, "succeeded");
  assert.deepEqual(state.output, { text: "done" });
  assert.equal(state.terminal, true);
});

test("run.failed ends the run with its error", () => {
  const state = started();
  state.applyEnvelope(envelope(3, "run.failed", { error: { type: "ValueError", message: "bad" } }));
  assert.equal(state.status, "failed");
  assert.deepEqual(state.error, { type: "ValueError", message: "bad" });
  assert.equal(state.terminal, true);
});

test("a cancel request makes the run cancelling, run.cancelled records reason and stage", () => {
  const state = started();
  state.applyEnvelope(envelope(3, "run.cancel_requested", { reason: "enough" }));
  assert.equal(state.status, "cancelling");
  assert.equal(state.terminal, false);
  assert.deepEqual(state.cancel, { requested_at: TS, reason: "enough", stage: null });
  const stage = { seq: 2, step: "message m1 streaming" };
  state.applyEnvelope(envelope(4, "run.cancelled", { reason: "enough", stage }));
  assert.equal(state.status, "cancelled");
  assert.deepEqual(state.cancel, { requested_at: TS, reason: "enough", stage });
  assert.equal(state.terminal, true);
});

test("run.interrupted ends the run with its reason", () => {
  const state = started();
  state.applyEnvelope(envelope(3, "run.interrupted", { reason: "server_shutdown" }));
  assert.equal(state.status, "interrupted");
  assert.equal(state.interruptReason, "server_shutdown");
  assert.equal(state.terminal, true);
});

test("a loaded run brings its status, output, error and cancel", () => {
  const cancel = { requested_at: TS, reason: "r", stage: { seq: 1, step: "started" } };
  const state = new RunState(RUN);
  state.loadRun(runObject({ status: "cancelled", last_seq: 3, cancel }));
  assert.equal(state.status, "cancelled");
  assert.deepEqual(state.cancel, cancel);
  assert.equal(state.terminal, true);
});

test("a question makes the run waiting until every open one is answered", () => {
  const state = started();
  const ask = (seq, id) => envelope(seq, "input.requested", { request_id: id, kind: "approval", title: "Go?", details: null, choices: ["approve", "deny"] });
  state.applyEnvelope(ask(3, "in_a"));
  assert.equal(state.status, "waiting");
  state.applyEnvelope(ask(4, "in_b"));
  state.applyEnvelope(envelope(5, "input.resolved", { request_id: "in_a", choice: "approve", note: null, by: "alice" }));
  assert.equal(state.status, "waiting", "one question is still open");
  state.applyEnvelope(envelope(6, "input.resolved", { request_id: "in_b", choice: "deny", note: null, by: "alice" }));
  assert.equal(state.status, "running");
  assert.deepEqual(state.unknown, [], "input events are known types");
  // A cancel while waiting stays cancelling when the question is given up on.
  state.applyEnvelope(ask(7, "in_c"));
  state.applyEnvelope(envelope(8, "run.cancel_requested", { reason: "stop" }));
  state.applyEnvelope(envelope(9, "input.resolved", { request_id: "in_c", choice: null, note: null, by: null, reason: "cancelled" }));
  assert.equal(state.status, "cancelling");
});

test("a takeover (run.resumed) keeps the run going, waiting while a question is open, and counts the attempt", () => {
  const state = started();
  assert.equal(state.applyEnvelope(envelope(3, "text.delta", { message_id: "m1", delta: "Hel" })), "applied");
  const resumed = envelope(4, "run.resumed", { attempt: 2, reason: "lease_expired", from_seq: 3 });
  assert.equal(state.applyEnvelope(resumed), "applied");
  assert.equal(state.status, "running");
  assert.equal(state.attempt, 2);
  assert.equal(state.resumedAt, TS);
  assert.deepEqual(state.unknown, []); // a known type, not shown generically
  assert.equal(state.applyEnvelope(envelope(5, "text.delta", { message_id: "m1", delta: "lo" })), "applied");
  assert.equal(state.snapshot.messages[0].text, "Hello"); // the same message goes on

  const asking = new RunState(RUN);
  asking.applyEnvelope(envelope(1, "run.started"));
  asking.applyEnvelope(envelope(2, "input.requested", { request_id: "in_1", kind: "approval", title: "ok?", choices: ["approve", "deny"] }));
  asking.applyEnvelope(envelope(3, "run.resumed", { attempt: 3, reason: "server_shutdown", from_seq: 2 }));
  assert.equal(asking.status, "waiting");
  assert.equal(asking.attempt, 3);
  assert.equal(new RunState(RUN).loadRun(runObject({ attempt: 4 })), "loaded");
});
