// Unified diffs computed from a tool step's old and new text, and how they are shown.
import assert from "node:assert/strict";
import { test } from "node:test";

import { installPage } from "./dom.mjs";

installPage();
const { CONTEXT_LINES, MAX_EDITS, diffLines, hunkHeader, splitLines, unifiedDiff } = await import("../src/diff.js");
const { DIFF_OPEN_LINES, MAX_DIFF_LINES, diffBlock } = await import("../src/dom.js");

/** The diff as `diff -u` prints it, without the file lines. */
function printed(oldText, newText) {
  return unifiedDiff(oldText, newText)
    .hunks.map((hunk) => [hunkHeader(hunk), ...hunk.lines.map((line) => line.op + line.text)].join("\n"))
    .join("\n");
}

const numbered = (count, change = {}) =>
  Array.from({ length: count }, (_, i) => (i + 1 in change ? change[i + 1] : `line ${i + 1}`)).join("\n") + "\n";

test("lines of a text: a final newline ends the last line, CRLF is a line end", () => {
  assert.deepEqual(splitLines(""), []);
  assert.deepEqual(splitLines("a\nb\n"), ["a", "b"]);
  assert.deepEqual(splitLines("a\r\nb"), ["a", "b"]);
  assert.deepEqual(splitLines("\n"), [""]);
});

test("a changed line in a long file is one hunk with three lines of context, as diff -u prints it", () => {
  assert.equal(CONTEXT_LINES, 3);
  assert.equal(
    printed(numbered(20), numbered(20, { 10: "line ten" })),
    ["@@ -7,7 +7,7 @@", " line 7", " line 8", " line 9", "-line 10", "+line ten", " line 11", " line 12", " line 13"].join("\n")
  );
});

test("changes close together share a hunk; changes far apart get one each", () => {
  const near = unifiedDiff(numbered(30), numbered(30, { 10: "a", 16: "b" }));
  assert.equal(near.hunks.length, 1);
  assert.equal(hunkHeader(near.hunks[0]), "@@ -7,13 +7,13 @@");
  const far = unifiedDiff(numbered(30), numbered(30, { 5: "a", 25: "b" }));
  assert.deepEqual(far.hunks.map(hunkHeader), ["@@ -2,7 +2,7 @@", "@@ -22,7 +22,7 @@"]);
  assert.equal(far.added, 2);
  assert.equal(far.removed, 2);
});

test("insertions and deletions at either end, and a new file, number their lines as diff -u does", () => {
  assert.equal(printed("a\nb\n", "x\na\nb\n"), "@@ -1,2 +1,3 @@\n+x\n a\n b");
  assert.equal(printed("a\nb\nc\n", "a\nb\n"), "@@ -1,3 +1,2 @@\n a\n b\n-c");
  assert.equal(printed("a\n", ""), "@@ -1 +0,0 @@\n-a");
  assert.equal(printed(null, "x = 2\ny = 3\n"), "@@ -0,0 +1,2 @@\n+x = 2\n+y = 3");
  assert.equal(printed("same\n", "same\n"), "");
});

test("the edit script is the shortest: every line of both texts once, in order", () => {
  const a = ["a", "b", "c", "a", "b", "b", "a"];
  const b = ["c", "b", "a", "b", "a", "c"];
  const lines = diffLines(a, b);
  assert.deepEqual(lines.filter((line) => line.op !== "+").map((line) => line.text), a);
  assert.deepEqual(lines.filter((line) => line.op !== "-").map((line) => line.text), b);
  assert.equal(lines.filter((line) => line.op !== " ").length, 5); // Myers' own example: D = 5
});

test("texts that differ everywhere are the old lines replaced by the new, at bounded cost", () => {
  const count = MAX_EDITS * 3;
  const a = Array.from({ length: count }, (_, i) => `old ${i}`);
  const b = Array.from({ length: count }, (_, i) => `new ${i}`);
  const started = Date.now();
  const lines = diffLines(a, b);
  assert.ok(Date.now() - started < 2000, `${Date.now() - started} ms`);
  assert.deepEqual(lines.slice(0, count).map((line) => line.op), Array(count).fill("-"));
  assert.deepEqual(lines.slice(count).map((line) => line.op), Array(count).fill("+"));
});

test("a diff shows the file's name, its counts, and each line tinted by what happened to it", () => {
  const block = diffBlock("src/plot.py", "x = 1\ny = 2\n", "x = 2\ny = 2\nz = 3\n");
  assert.equal(block.tagName, "DETAILS");
  assert.equal(block.open, true, "a short diff is shown unfolded");
  assert.equal(block.querySelector(".agentruns-diff-path").textContent, "src/plot.py");
  assert.equal(block.querySelector(".agentruns-diff-added").textContent, "+2");
  assert.equal(block.querySelector(".agentruns-diff-removed").textContent, "−1");
  const lines = [...block.querySelectorAll(".agentruns-diff-line")].map((line) => [line.dataset.op, line.textContent]);
  assert.deepEqual(lines, [
    ["hunk", "@@ -1,2 +1,3 @@"], ["removed", "-x = 1"], ["added", "+x = 2"], ["context", " y = 2"], ["added", "+z = 3"],
  ]);
  assert.equal(diffBlock("new.py", null, "a\n").querySelector(".agentruns-diff-new").textContent, "new file");
});

test("a long diff starts folded, and only so many of its lines are drawn", () => {
  const long = diffBlock("big.txt", null, numbered(DIFF_OPEN_LINES + 5));
  assert.equal(long.open, false);
  const huge = diffBlock("huge.txt", null, numbered(MAX_DIFF_LINES + 500));
  const lines = huge.querySelectorAll(".agentruns-diff-line");
  assert.equal(lines.length, MAX_DIFF_LINES + 1);
  assert.equal(lines[lines.length - 1].textContent, "… 501 more lines");
});

test("what a diff holds is text: markup in a file's lines or name makes no element", () => {
  const hostile = '<img src="http://127.0.0.1:9/x" onerror="globalThis.pwned=1"><script>globalThis.pwned=2</script>';
  const block = diffBlock(hostile, null, `${hostile}\n`);
  assert.equal(block.querySelector("img, script"), null);
  assert.equal(block.querySelector(".agentruns-diff-path").textContent, hostile);
  assert.equal(block.querySelector('[data-op="added"]').textContent, `+${hostile}`);
});
