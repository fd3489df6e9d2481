// The notebook's record of a run: brought up to date only when something changed.
import assert from "node:assert/strict";
import { test } from "node:test";

import { MIME_TYPE, fetchRecord, plainText, runData, switchedBundle, updatedBundle } from "../src/record.js";

const WIDGET = "application/vnd.jupyter.widget-view+json";
const done = { run_id: "run_a", status: "succeeded", last_seq: 40, agent: "demo" };

function bundle(fields = {}) {
  return {
    [MIME_TYPE]: { run_id: "run_a", status: "running", last_seq: 3, agent: "demo" },
    "text/markdown": "**demo** running",
    "text/plain": "Run(run_id='run_a', status='running')",
    [WIDGET]: { model_id: "m1", version_major: 2, version_minor: 1 },
    ...fields,
  };
}

test("run data is read defensively from the output", () => {
  assert.deepEqual(runData(bundle()), { run_id: "run_a", status: "running", last_seq: 3, agent: "demo" });
  assert.equal(runData({}), null);
  assert.equal(runData({ [MIME_TYPE]: { run_id: "" } }), null);
  assert.deepEqual(runData({ [MIME_TYPE]: { run_id: "run_b", last_seq: "7" } }), { run_id: "run_b", status: "", last_seq: 0, agent: "" });
});

test("a finished run updates a stale output, keeping the widget view", () => {
  const next = updatedBundle(bundle(), done, "**demo** succeeded\n\nHello");
  assert.ok(next);
  assert.deepEqual(next[MIME_TYPE], done);
  assert.equal(next["text/markdown"], "**demo** succeeded\n\nHello");
  assert.equal(next["text/plain"], plainText("run_a", "succeeded"));
  assert.deepEqual(next[WIDGET], bundle()[WIDGET]);
});

test("an output already up to date is left alone: no dirty notebook", () => {
  const current = bundle({ [MIME_TYPE]: done, "text/markdown": "rec", "text/plain": plainText("run_a", "succeeded") });
  assert.equal(updatedBundle(current, done, "rec"), null);
});

test("only a changed record is news when the state is the same", () => {
  const current = bundle({ [MIME_TYPE]: done, "text/markdown": "old", "text/plain": plainText("run_a", "succeeded") });
  assert.equal(updatedBundle(current, done, "new")["text/markdown"], "new");
});

test("without a record from the server the saved one stays", () => {
  const next = updatedBundle(bundle(), done, null);
  assert.equal(next["text/markdown"], "**demo** running");
  const current = bundle({ [MIME_TYPE]: done, "text/plain": plainText("run_a", "succeeded") });
  assert.equal(updatedBundle(current, done, null), null);
});

test("a kernel's text/plain is not ours to rewrite", () => {
  const current = bundle({ "text/plain": "Run(base_url='/', last_seq=3)" });
  assert.equal(updatedBundle(current, done, "r")["text/plain"], "Run(base_url='/', last_seq=3)");
});

test("Run again switches the output to the new run and drops the old record", () => {
  const fresh = { run_id: "run_b", status: "queued", last_seq: 0, agent: "demo" };
  const next = switchedBundle(bundle(), fresh, null);
  assert.deepEqual(next[MIME_TYPE], fresh);
  assert.equal("text/markdown" in next, false);
  assert.equal(next["text/plain"], plainText("run_b", "queued"));
  assert.equal(switchedBundle(bundle(), fresh, "rec b")["text/markdown"], "rec b");
});

test("the record is asked for as text/markdown, and only a Markdown answer counts", async () => {
  const calls = [];
  const answer = (body, type, status = 200) => async (url, init) => {
    calls.push([url, init]);
    return new Response(body, { status, headers: { "Content-Type": type } });
  };
  assert.equal(await fetchRecord(answer("# run", "text/markdown; charset=UTF-8"), "/api/agentruns/runs/run_a"), "# run");
  assert.equal(calls[0][1].headers.Accept, "text/markdown");
  assert.equal(calls[0][1].credentials, "same-origin");
  assert.equal(await fetchRecord(answer('{"run_id": "run_a"}', "application/json"), "/x"), null);
  assert.equal(await fetchRecord(answer('{"error": "run_not_found"}', "text/markdown", 404), "/x"), null);
  assert.equal(await fetchRecord(async () => { throw new TypeError("offline"); }, "/x"), null);
});
