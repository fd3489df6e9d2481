// Unified diffs of the files an agent changed, computed here from the old and
// new text a tool step reports: lines, Myers' shortest edit script, hunks.

/** More edits than this between two texts: shown as the old lines replaced by the new ones. */
export const MAX_EDITS = 1000;
// The search costs about (lines of both texts) × (edits): long texts get fewer edits.
const MAX_WORK = 20_000_000;
/** Lines of unchanged text kept around each change. */
export const CONTEXT_LINES = 3;

/**
 * @typedef {{op: " " | "-" | "+", text: string}} DiffLine
 * @typedef {{oldStart: number, oldLines: number, newStart: number, newLines: number, lines: DiffLine[]}} Hunk
 * @typedef {{hunks: Hunk[], added: number, removed: number}} Diff
 */

/**
 * The lines of a text; the newline that ends the last line makes no empty line after it.
 * @param {string} text
 * @returns {string[]}
 */
export function splitLines(text) {
  if (text === "") return [];
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  if (lines[lines.length - 1] === "") lines.pop();
  return lines;
}

/**
 * The edit script that turns lines `a` into lines `b`: the shortest one, or,
 * when they differ in more than `maxEdits` places, every line of `a` removed
 * and every line of `b` added (a person reads that as well, at bounded cost).
 * @param {string[]} a
 * @param {string[]} b
 * @param {number} [maxEdits]
 * @returns {DiffLine[]}
 */
export function diffLines(a, b, maxEdits = MAX_EDITS) {
  // Most edits touch a few lines in the middle: the equal ends cost nothing.
  let start = 0;
  while (start < a.length && start < b.length && a[start] === b[start]) start++;
  let endA = a.length;
  let endB = b.length;
  while (endA > start && endB > start && a[endA - 1] === b[endB - 1]) {
    endA--;
    endB--;
  }
  const middleA = a.slice(start, endA);
  const middleB = b.slice(start, endB);
  const middle = shortestEdit(middleA, middleB, maxEdits) ?? [
    ...middleA.map((text) => /** @type {DiffLine} */ ({ op: "-", text })),
    ...middleB.map((text) => /** @type {DiffLine} */ ({ op: "+", text })),
  ];
  /** @param {string} text */
  const same = (text) => /** @type {DiffLine} */ ({ op: " ", text });
  return [...a.slice(0, start).map(same), ...middle, ...a.slice(endA).map(same)];
}

/**
 * Myers' O(ND) algorithm; null when the texts differ in more than `maxEdits` lines.
 * @param {string[]} a
 * @param {string[]} b
 * @param {number} maxEdits
 * @returns {DiffLine[] | null}
 */
function shortestEdit(a, b, maxEdits) {
  const n = a.length;
  const m = b.length;
  const max = n + m;
  const limit = Math.min(max, maxEdits, Math.floor(MAX_WORK / Math.max(1, max)));
  const offset = max + 1;
  const v = new Int32Array(2 * max + 3);
  // The furthest x on each diagonal before each round, kept for the way back:
  // round d reads diagonals -d..d only, so that much of v is all it needs.
  /** @type {Int32Array[]} */
  const trace = [];
  for (let d = 0; d <= limit; d++) {
    trace.push(v.slice(offset - d, offset + d + 1));
    for (let k = -d; k <= d; k += 2) {
      const down = k === -d || (k !== d && v[offset + k - 1] < v[offset + k + 1]);
      let x = down ? v[offset + k + 1] : v[offset + k - 1] + 1;
      let y = x - k;
      while (x < n && y < m && a[x] === b[y]) {
        x++;
        y++;
      }
      v[offset + k] = x;
      if (x >= n && y >= m) return backtrack(a, b, trace);
    }
  }
  return null;
}

/**
 * @param {string[]} a
 * @param {string[]} b
 * @param {Int32Array[]} trace
 * @returns {DiffLine[]}
 */
function backtrack(a, b, trace) {
  /** @type {DiffLine[]} */
  const lines = [];
  let x = a.length;
  let y = b.length;
  for (let d = trace.length - 1; d > 0; d--) {
    const before = trace[d];
    const k = x - y;
    const down = k === -d || (k !== d && before[k - 1 + d] < before[k + 1 + d]);
    const previousK = down ? k + 1 : k - 1;
    const previousX = before[previousK + d];
    const previousY = previousX - previousK;
    while (x > previousX && y > previousY) {
      lines.push({ op: " ", text: a[x - 1] });
      x--;
      y--;
    }
    if (down) lines.push({ op: "+", text: b[y - 1] });
    else lines.push({ op: "-", text: a[x - 1] });
    x = previousX;
    y = previousY;
  }
  while (x > 0) {
    lines.push({ op: " ", text: a[x - 1] });
    x--;
  }
  return lines.reverse();
}

/**
 * The unified diff from `oldText` (null for a new file) to `newText`: its hunks, and the lines added and removed.
 * @param {string | null} oldText
 * @param {string} newText
 * @param {number} [context]
 * @returns {Diff}
 */
export function unifiedDiff(oldText, newText, context = CONTEXT_LINES) {
  const lines = diffLines(splitLines(oldText ?? ""), splitLines(newText));
  let added = 0;
  let removed = 0;
  /** @type {number[]} */
  const changed = [];
  lines.forEach((line, index) => {
    if (line.op === " ") return;
    changed.push(index);
    if (line.op === "+") added++;
    else removed++;
  });
  /** @type {Hunk[]} */
  const hunks = [];
  let index = 0;
  let counted = 0; // the lines before `counted` are numbered in oldLine, newLine
  let oldLine = 1;
  let newLine = 1;
  while (index < changed.length) {
    // A hunk takes in every change whose context touches the last one's.
    let last = index;
    while (last + 1 < changed.length && changed[last + 1] - changed[last] <= 2 * context + 1) last++;
    const from = Math.max(0, changed[index] - context);
    const to = Math.min(lines.length, changed[last] + context + 1);
    for (; counted < from; counted++) {
      if (lines[counted].op !== "+") oldLine++;
      if (lines[counted].op !== "-") newLine++;
    }
    const body = lines.slice(from, to);
    const oldLines = body.filter((line) => line.op !== "+").length;
    const newLines = body.filter((line) => line.op !== "-").length;
    hunks.push({
      // As diff(1) writes it: an empty side starts at the line before.
      oldStart: oldLines === 0 ? oldLine - 1 : oldLine,
      oldLines,
      newStart: newLines === 0 ? newLine - 1 : newLine,
      newLines,
      lines: body,
    });
    index = last + 1;
  }
  return { hunks, added, removed };
}

/**
 * A hunk's header line, as diff(1) writes it: the old and new line ranges between double at signs.
 * @param {Hunk} hunk
 * @returns {string}
 */
export function hunkHeader(hunk) {
  /** @param {number} start @param {number} count */
  const range = (start, count) => (count === 1 ? `${start}` : `${start},${count}`);
  return `@@ -${range(hunk.oldStart, hunk.oldLines)} +${range(hunk.newStart, hunk.newLines)} @@`;
}
