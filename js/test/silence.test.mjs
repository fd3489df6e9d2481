// A run whose agent says nothing: how long, counted from its last event, and only while it runs.
import assert from "node:assert/strict";
import { test } from "node:test";

import { RunState } from "../src/runstate.js";
import { SILENCE_SHOWN_AFTER_MS, silenceSpan, silenceWords } from "../src/silence.js";

const LAST = "2026-01-01T00:00:00.000Z";
const after = (ms) => Date.parse(LAST) + ms;

test("a running run silent for a minute or more says for how long, in whole minutes", () => {
  const state = { status: "running", lastEventAt: LAST };
  assert.equal(silenceWords(state, after(SILENCE_SHOWN_AFTER_MS - 1)), "");
  assert.equal(silenceWords(state, after(60_000)), "no word from the agent for 1 min");
  assert.equal(silenceWords(state, after(2 * 60_000 + 59_000)), "no word from the agent for 2 min");
  assert.equal(silenceSpan(65 * 60_000), "1 h 5 min");
});

test("a run waiting for a person, ended, or of unknown last event is never silent", () => {
  for (const status of ["waiting", "queued", "cancelling", "succeeded", "failed"]) {
    assert.equal(silenceWords({ status, lastEventAt: LAST }, after(3_600_000)), "");
  }
  assert.equal(silenceWords({ status: "running", lastEventAt: null }, after(3_600_000)), "");
  assert.equal(silenceWords({ status: "running", lastEventAt: "not a time" }, after(3_600_000)), "");
});

test("a view's state counts from the run object's last_event_at, then from each event it applies", () => {
  const state = new RunState("run_x");
  const run = { run_id: "run_x", agent: "demo", status: "running", last_seq: 1, snapshot: { messages: [], tools: [], progress: null, usage: null }, last_event_at: LAST };
  assert.equal(state.loadRun(run), "loaded");
  assert.equal(silenceWords(state, after(120_000)), "no word from the agent for 2 min");
  const later = new Date(after(100_000)).toISOString();
  state.applyEnvelope({ run_id: "run_x", seq: 2, type: "progress", ts: later, data: { fraction: null, message: "still here" } });
  assert.equal(state.lastEventAt, later);
  assert.equal(silenceWords(state, after(120_000)), "");
});
