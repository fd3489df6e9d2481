// What a run says to a person: the JS words, held to the same cases as jupyter_agentruns/words.py.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { answerWords, cancelledWords, clockTime, progressWords, runTitle, sameRunWords, timingWords } from "../src/words.js";

const CASES = JSON.parse(readFileSync(new URL("../../tests/vectors/words/cases.json", import.meta.url), "utf8"));
const NOW = Date.parse(CASES.now);

for (const { name, run, says } of CASES.title) {
  test(`title: ${name}`, () => assert.equal(runTitle(run), says));
}

for (const { name, run, says } of CASES.timing) {
  test(`timing: ${name}`, () => {
    const state = { status: run.status, startedAt: run.started_at, finishedAt: run.finished_at };
    assert.equal(timingWords(state, NOW), says);
  });
}

for (const { name, status, progress, says } of CASES.progress) {
  test(`progress: ${name}`, () => assert.equal(progressWords(status, progress), says));
}

for (const { name, request, says } of CASES.answer) {
  test(`answer: ${name}`, () => assert.equal(answerWords(request), says));
}

for (const { name, reason, says } of CASES.cancelled) {
  test(`cancelled: ${name}`, () => assert.equal(cancelledWords(reason), says));
}

test("a waiting run seen starting to wait says since when", () => {
  const since = "2026-01-01T00:09:56.000Z";
  const state = { status: "waiting", startedAt: "2026-01-01T00:09:00.000Z", finishedAt: null, waitingSince: since };
  assert.equal(timingWords(state, NOW), `waiting for an answer since ${clockTime(Date.parse(since))}`);
});

test("the same run found again offers Run again once it has ended", () => {
  assert.equal(sameRunWords("succeeded"), "the same run as before: Run again for a new one");
  assert.equal(sameRunWords("running"), "the same run as before, still going");
});
