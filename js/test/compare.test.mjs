// Two runs compared: facts side by side, a fork's steps aligned after its original's, the answers diffed.
import assert from "node:assert/strict";
import { test } from "node:test";

import { installPage } from "./dom.mjs";

installPage();
const { ComparePage, answerText, runTime, stepLine } = await import("../src/compare.js");

const step = (n, status = "completed") => ({ call_id: `c${n}`, name: "count", args: { n }, status, result: n });

const ORIGINAL = {
  run_id: "run_original", agent: "counter", status: "succeeded", input: { prompt: "count the apples", to: 3 },
  started_at: "2026-12-07T10:00:00Z", finished_at: "2026-12-07T10:00:04Z", forked_from: null,
  snapshot: { messages: [{ id: "m", role: "assistant", text: "three apples\nred", done: true }], tools: [step(0), step(1), step(2)], usage: { input_tokens: 1200, output_tokens: 30, cost: 0.5 } },
  output: null,
};
const FORK = {
  ...ORIGINAL, run_id: "run_fork", input: { prompt: "count the pears", to: 3, start: 2 }, forked_from: { run_id: "run_original", seq: 6 },
  started_at: "2026-12-07T10:01:00Z", finished_at: "2026-12-07T10:01:01.500Z",
  snapshot: { messages: [{ id: "m", role: "assistant", text: "three pears\nred", done: true }], tools: [step(2)], usage: { input_tokens: 1200, output_tokens: 28 } },
};
// The original's log: its third step started after event 6.
const EVENTS = [1, 2, 3, 4, 5, 6, 7, 8].map((seq) => ({ seq, type: [2, 4, 7].includes(seq) ? "tool.started" : "x" }));

function server() {
  const requests = [];
  const fetch = async (url) => {
    requests.push(url);
    if (url.includes("/events?")) {
      const after = Number(new URL(url, "http://h").searchParams.get("after"));
      const limit = Number(new URL(url, "http://h").searchParams.get("limit"));
      return Response.json({ events: EVENTS.filter((e) => e.seq > after).slice(0, limit), done: false });
    }
    const id = url.split("/").pop();
    const run = { run_original: ORIGINAL, run_fork: FORK }[id];
    return run ? Response.json(run) : Response.json({ error: "run_not_found", message: `No run ${id}.` }, { status: 404 });
  };
  return { fetch, requests };
}

const cells = (row) => [...row.querySelectorAll("td")].map((cell) => cell.textContent);

test("the facts side by side, differing ones marked; a fork's steps start after the original's before it", async () => {
  const opened = [];
  const page = new ComparePage({ baseUrl: "/", left: "run_original", right: "run_fork", fetch: server().fetch, openRun: (id) => opened.push(id) });
  await page.load();
  const facts = Object.fromEntries(
    [...page.node.querySelectorAll(".agentruns-compare-fact")].map((row) => [row.querySelector("th").textContent, [cells(row), row.classList.contains("agentruns-compare-differs")]])
  );
  assert.deepEqual(facts["Agent"], [["counter", "counter"], false]);
  assert.deepEqual(facts["Input tokens"], [["1,200", "1,200"], false]);
  assert.deepEqual(facts["Output tokens"], [["30", "28"], true]);
  assert.deepEqual(facts["Cost"], [["0.50", ""], true]);
  assert.deepEqual(facts["Time"][0], ["4.0 s", "1.5 s"]);
  assert.deepEqual(facts["Forked from"], [["", "run_original after event 6"], true]);
  const steps = [...page.node.querySelectorAll(".agentruns-compare-step")].map((row) => [cells(row), row.classList.contains("agentruns-compare-differs")]);
  assert.deepEqual(steps, [
    [['count {"n":0} · completed', "(before the fork)"], false],
    [['count {"n":1} · completed', "(before the fork)"], false],
    [['count {"n":2} · completed', 'count {"n":2} · completed'], false],
  ]);
  const answers = [...page.node.querySelectorAll(".agentruns-compare-answer")].map((node) => node.textContent);
  assert.deepEqual(answers, ["three apples\nred", "three pears\nred"]);
  const diff = [...page.node.querySelectorAll(".agentruns-diff-line")].map((line) => [line.dataset.op, line.textContent]);
  assert.deepEqual(diff.filter(([op]) => op !== "hunk"), [["removed", "-three apples"], ["added", "+three pears"], ["context", " red"]]);
  page.node.querySelectorAll(".agentruns-compare-run")[1].click();
  assert.deepEqual(opened, ["run_fork"]);
});

test("a run that cannot be read is said, nothing drawn", async () => {
  const page = new ComparePage({ baseUrl: "/", left: "run_original", right: "run_gone", fetch: server().fetch });
  await page.load();
  assert.equal(page.node.querySelector(".agentruns-compare-note").textContent, "Cannot compare: run_gone: No run run_gone.");
  assert.equal(page.node.querySelector("table"), null);
});

test("an answer is its output's text, else what the agent said; a step is its title or call and its end", () => {
  assert.equal(answerText({ output: { text: "42" }, snapshot: { messages: [] } }), "42");
  assert.equal(answerText({ output: { n: 1 }, snapshot: { messages: [] } }), '{\n  "n": 1\n}');
  assert.equal(answerText({ output: null, snapshot: { messages: [{ role: "assistant", text: "a" }, { role: "assistant", text: "b" }] } }), "a\n\nb");
  assert.equal(stepLine({ name: "read", args: {}, title: "Read a.py", status: "failed" }), "Read a.py · failed");
  assert.equal(runTime({ started_at: null }), "");
});
