// A question's long title and many or long choices: cut, the whole on hover, and listed one a line.
import assert from "node:assert/strict";
import { test } from "node:test";

import { installPage } from "./dom.mjs";

installPage();
const { LABEL_CHARS, TITLE_CHARS, choicesAsList, cutText, inputCard } = await import("../src/dom.js");
const { questionWords } = await import("../src/attention.js");

const long = (n) => `option ${n} ` + "very long words ".repeat(15); // about 250 characters

function permission(count, name) {
  const options = Array.from({ length: count }, (_, n) => ({ optionId: `o${n}`, name: name(n), kind: n === 0 ? "allow_once" : "reject_once" }));
  return {
    request_id: "in_1", kind: "permission", title: "T".repeat(5000), choices: options.map((option) => option.optionId),
    status: "open", choice: null, details: { options },
  };
}

test("text is cut to its limit with an ellipsis, by whole characters, and kept whole when it fits", () => {
  assert.equal(cutText("short", 10), "short");
  assert.equal(cutText("0123456789", 10), "0123456789");
  assert.equal(cutText("0123456789a", 10), "012345678…");
  assert.equal(cutText("ab   cdefgh", 6), "ab…"); // no blanks before the ellipsis
  assert.equal(cutText("😀".repeat(12), 10), `${"😀".repeat(9)}…`);
});

test("more than three choices, or one longer than 40 characters, are a list", () => {
  assert.equal(choicesAsList(["Allow once", "Always allow", "Reject"]), false);
  assert.equal(choicesAsList(["a", "b", "c", "d"]), true);
  assert.equal(choicesAsList(["Allow", "x".repeat(41)]), true);
  assert.equal(choicesAsList(["Allow", "x".repeat(40)]), false);
});

test("twenty options of 250 characters: cut labels with the whole on hover, listed, each still answers its own id", () => {
  const input = permission(20, long);
  const answered = [];
  const card = inputCard(input, (choice) => answered.push(choice));
  const title = card.querySelector(".agentruns-input-title");
  assert.equal(Array.from(title.textContent).length, TITLE_CHARS);
  assert.equal(title.title, input.title);
  const choices = card.querySelector(".agentruns-input-choices");
  assert.ok(choices.classList.contains("agentruns-input-choices--list"));
  const buttons = [...choices.querySelectorAll(".agentruns-choice")];
  assert.equal(buttons.length, 20);
  for (const [n, node] of buttons.entries()) {
    assert.equal(Array.from(node.textContent).length, LABEL_CHARS);
    assert.ok(node.textContent.startsWith(`option ${n} `) && node.textContent.endsWith("…"));
    assert.equal(node.title, `${long(n)} (${n === 0 ? "allow once" : "reject once"})`);
  }
  buttons[7].click();
  assert.deepEqual(answered, ["o7"]);
});

test("a few short options stay a row with their kind on hover; a resolved long answer is cut too", () => {
  const few = inputCard(permission(3, (n) => ["Allow once", "Always allow", "Reject"][n]), () => {});
  assert.equal(few.querySelector(".agentruns-input-choices--list"), null);
  const buttons = [...few.querySelectorAll(".agentruns-choice")];
  assert.deepEqual(buttons.map((node) => [node.textContent, node.title]), [
    ["Allow once", "allow once"], ["Always allow", "reject once"], ["Reject", "reject once"],
  ]);
  const resolved = inputCard({ ...permission(20, long), status: "resolved", choice: "o3" }, () => {});
  const said = resolved.querySelector(".agentruns-input-answer");
  assert.equal(Array.from(said.textContent).length, TITLE_CHARS);
  assert.ok(said.title.startsWith(long(3)));
});

test("a toast's question title is cut", () => {
  const words = questionWords({ run_id: "run_1", agent: "acp", input: { prompt: "p" }, session: null }, { title: "T".repeat(5000) });
  assert.equal(words, `A run asks: ${"T".repeat(TITLE_CHARS - 1)}… (p)`);
});

test("an in-doubt question shows its step's code as code and names its choices in words", () => {
  const input = {
    request_id: "in_2", kind: "in_doubt", title: "The server stopped during run_code: run it again?",
    choices: ["run_again", "skip", "stop"], status: "open", choice: null,
    details: { call_id: "call_1", tool: "run_code", args: { code: "df = load()\nx = 1", timeout: 30 } },
  };
  const answered = [];
  const card = inputCard(input, (choice) => answered.push(choice));
  assert.equal(card.querySelector(".agentruns-input-step .agentruns-input-details").textContent, 'run_code {"timeout":30}');
  assert.equal(card.querySelector(".agentruns-input-step .agentruns-code").textContent, "df = load()\nx = 1");
  const buttons = [...card.querySelectorAll(".agentruns-choice")];
  assert.deepEqual(buttons.map((node) => node.textContent), ["Run it again", "Skip it", "Stop the run"]);
  buttons[1].click();
  assert.deepEqual(answered, ["skip"]);
});

test("an answered in-doubt question says what was chosen in words", () => {
  const input = { request_id: "in_3", kind: "in_doubt", title: "t", choices: ["run_again", "skip", "stop"],
                  status: "resolved", choice: "skip", by: "ann", details: { tool: "run_code", args: {} } };
  assert.equal(inputCard(input, () => {}).querySelector(".agentruns-input-answer").textContent, "skipped by ann");
});
