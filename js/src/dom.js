// What the run view and the runs panel both build pages from: elements, and
// times, costs, questions, tool steps and the diffs of changed files put in words.

import { hunkHeader, unifiedDiff } from "./diff.js";
import { highlightPython } from "./highlight.js";
import { compactJson, isPlainObject } from "./json.js";
import { answerWords, choiceName, permissionOptions } from "./words.js";

/**
 * @typedef {import("./reducer.js").Input} Input
 */

/** Text a tool step showed, beyond this many characters, is cut (the run keeps all of it). */
export const MAX_TOOL_TEXT_CHARS = 20_000;
/** Content items shown per tool step. */
export const MAX_CONTENT_ITEMS = 20;
/** A choice's label beyond this many characters is cut (the whole of it on hover). */
export const LABEL_CHARS = 60;
/** A question's title or answer beyond this many characters is cut (the whole of it on hover). */
export const TITLE_CHARS = 200;
/** More choices than this, or one longer than INLINE_LABEL_CHARS, are a list, one a line. */
const INLINE_CHOICES = 3;
const INLINE_LABEL_CHARS = 40;

/**
 * `text` cut to `limit` characters, an ellipsis its last, or whole when it fits.
 * @param {string} text
 * @param {number} limit
 * @returns {string}
 */
export function cutText(text, limit) {
  const chars = Array.from(text); // whole characters: an emoji is not cut in two
  return chars.length <= limit ? text : `${chars.slice(0, limit - 1).join("").trimEnd()}…`;
}

/**
 * Whether a question's choices read better as a list of full-width buttons than as a row.
 * @param {string[]} labels
 * @returns {boolean}
 */
export function choicesAsList(labels) {
  return labels.length > INLINE_CHOICES || labels.some((label) => Array.from(label).length > INLINE_LABEL_CHARS);
}

/**
 * An element whose text is `text` cut to `limit`, the whole of it on hover when cut.
 * @param {string} tag
 * @param {string} className
 * @param {string} text
 * @param {number} limit
 * @returns {HTMLElement}
 */
function cutElement(tag, className, text, limit) {
  const node = element(tag, className, cutText(text, limit));
  if (node.textContent !== text) node.title = text;
  return node;
}

/** A diff of more lines than this starts folded. */
export const DIFF_OPEN_LINES = 40;
/** Lines of one diff shown at most. */
export const MAX_DIFF_LINES = 2000;

/**
 * "just now", "3 min ago", "5 h ago": how long ago `then` was.
 * @param {number} then ms since the epoch
 * @param {number} now ms since the epoch
 * @returns {string}
 */
export function formatAgo(then, now) {
  const seconds = Math.floor((now - then) / 1000);
  if (seconds < 10) return "just now";
  if (seconds < 60) return `${seconds} s ago`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min ago`;
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return `${hours} h ago`;
  return `${Math.floor(hours / 24)} days ago`;
}

/**
 * @param {string | null | undefined} text
 * @returns {number | null}
 */
export function parseTime(text) {
  if (!text) return null;
  const ms = Date.parse(text);
  return Number.isNaN(ms) ? null : ms;
}

/**
 * @param {string} tag
 * @param {string} [className]
 * @param {string} [text]
 * @returns {HTMLElement}
 */
export function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/**
 * Code, preformatted and highlighted as Python (the notebook tools' run_code).
 * @param {string} code
 * @returns {HTMLElement}
 */
export function codeBlock(code) {
  const pre = element("pre", "agentruns-code");
  const block = element("code", "language-python");
  highlightPython(block, code);
  pre.appendChild(block);
  return pre;
}

/**
 * @param {string} text
 * @param {string} className
 * @returns {HTMLButtonElement}
 */
export function button(text, className) {
  const node = /** @type {HTMLButtonElement} */ (element("button", `agentruns-button ${className}`, text));
  node.type = "button";
  return node;
}

/**
 * A question the agent asked a person: a button per choice while open, the answer once resolved.
 *
 * A permission question (kind "permission") names its choices in
 * `details.options` and says in `details.tool` which tool step it is about:
 * the buttons say the options' names, and the card shows that step.
 * @param {Input} input
 * @param {(choice: string, card: HTMLElement) => void} answer
 * @returns {HTMLElement}
 */
export function inputCard(input, answer) {
  const card = element("div", `agentruns-input agentruns-input--${input.status}`);
  card.dataset.requestId = String(input.request_id);
  card.dataset.status = String(input.status);
  const head = element("div", "agentruns-input-head");
  head.append(
    element("span", "agentruns-input-kind", String(input.kind || "question")),
    cutElement("span", "agentruns-input-title", String(input.title || ""), TITLE_CHARS)
  );
  card.appendChild(head);
  const options = permissionOptions(input);
  if (options !== null) {
    const tool = input.details.tool;
    if (isPlainObject(tool)) card.appendChild(aboutTool(tool));
  } else if (input.kind === "in_doubt" && isPlainObject(input.details)) {
    card.appendChild(doubtedStep(input.details));
  } else if (isEditDetails(input.details)) {
    // A notebook edit asked first (notebook_edits = "ask"): the cell as it is, and as it would be.
    card.appendChild(editDiff(input.details));
  } else if (isPlainObject(input.details) && typeof input.details.code === "string") {
    // Code about to run (the notebook tools' run_code): shown as code, whole.
    card.appendChild(codeBlock(input.details.code));
  } else if (input.details !== null && input.details !== undefined) {
    const text = typeof input.details === "string" ? input.details : compactJson(input.details, 400);
    card.appendChild(element("div", "agentruns-input-details", text));
  }
  if (input.status === "open") {
    const offered = (Array.isArray(input.choices) ? input.choices : []).map(String);
    const labels = offered.map((choice) => choiceName(input, choice));
    // Many choices, or long ones, one a line: a row of them would be a wall of narrow buttons.
    const choices = element("div", `agentruns-input-choices${choicesAsList(labels) ? " agentruns-input-choices--list" : ""}`);
    offered.forEach((choice, index) => {
      const option = options && options.get(choice);
      const label = labels[index];
      const node = button(cutText(label, LABEL_CHARS), `agentruns-choice${option ? optionClass(option.kind) : ""}`);
      node.dataset.choice = choice;
      const kind = option && option.kind ? option.kind.replace(/_/g, " ") : "";
      const whole = node.textContent === label ? "" : label;
      if (whole || kind) node.title = whole && kind ? `${whole} (${kind})` : whole || kind;
      node.addEventListener("click", () => answer(choice, card));
      choices.appendChild(node);
    });
    card.appendChild(choices);
  } else {
    const said = cutElement("div", "agentruns-input-answer", answerWords(input), TITLE_CHARS);
    if (input.choice !== null && input.choice !== undefined) said.dataset.choice = String(input.choice);
    card.appendChild(said);
  }
  return card;
}

/**
 * Whether a question's details are a notebook edit's (its op, cell, and the cell's text before and after).
 * @param {unknown} details
 * @returns {details is Record<string, any>}
 */
function isEditDetails(details) {
  return (
    isPlainObject(details) &&
    ["insert", "edit", "delete"].includes(/** @type {any} */ (details).op) &&
    typeof details.cell_id === "string"
  );
}

/**
 * A notebook edit asked about, as the diff its card in the run's edits will show.
 * @param {Record<string, any>} details
 * @returns {HTMLElement}
 */
function editDiff(details) {
  /** @param {unknown} side */
  const text = (side) => (typeof side === "string" ? side : Array.isArray(side) ? side.map(String).join("") : "");
  const notebook = typeof details.notebook === "string" && details.notebook ? details.notebook : "notebook";
  const block = /** @type {HTMLDetailsElement} */ (diffBlock(`${notebook} · ${details.op} cell ${details.cell_id}`, text(details.before), text(details.after)));
  block.open = true;
  return block;
}

/**
 * The step an in-doubt question is about: the tool and its arguments, its code (run_code,
 * execute_cell's cell) shown as code, whole.
 * @param {Record<string, any>} details
 * @returns {HTMLElement}
 */
function doubtedStep(details) {
  const node = element("div", "agentruns-input-step");
  const args = isPlainObject(details.args) ? details.args : {};
  const code = typeof args.code === "string" ? args.code : null;
  const rest = code === null ? args : Object.fromEntries(Object.entries(args).filter(([name]) => name !== "code"));
  const shown = Object.keys(rest).length ? ` ${compactJson(rest, 300)}` : "";
  node.appendChild(element("div", "agentruns-input-details", `${String(details.tool ?? "a step")}${shown}`));
  if (code !== null) node.appendChild(codeBlock(code));
  return node;
}

/**
 * Allowing is the primary action, rejecting the secondary one.
 * @param {string} kind
 */
function optionClass(kind) {
  if (kind.startsWith("allow")) return " agentruns-choice--allow";
  if (kind.startsWith("reject")) return " agentruns-choice--reject";
  return "";
}

/**
 * The tool step a permission question is about: its kind, its title, and what it would change.
 * @param {Record<string, any>} tool
 * @returns {HTMLElement}
 */
function aboutTool(tool) {
  const about = element("div", "agentruns-input-tool");
  const head = element("div", "agentruns-input-tool-head");
  const kind = kindLabel(tool.kind);
  if (kind !== null) head.appendChild(kind);
  const title = tool.title ?? tool.name;
  head.appendChild(element("span", "agentruns-input-tool-title", typeof title === "string" ? title : compactJson(title ?? "", 200)));
  about.appendChild(head);
  const content = toolContent(tool.content);
  if (content !== null) about.appendChild(content);
  return about;
}

/**
 * A tool step's kind (read, edit, execute, ...) as a small label; null when it has none.
 * @param {unknown} kind
 * @returns {HTMLElement | null}
 */
export function kindLabel(kind) {
  if (typeof kind !== "string" || kind === "") return null;
  const label = element("span", "agentruns-tool-kind", kind.length > 20 ? `${kind.slice(0, 19)}…` : kind);
  label.dataset.kind = kind;
  return label;
}

/**
 * What a tool step showed: its text, preformatted, and the diffs of the files it changed.
 * Null when there is nothing to show.
 * @param {unknown} content
 * @returns {HTMLElement | null}
 */
export function toolContent(content) {
  const items = Array.isArray(content) ? content : [];
  const box = element("div", "agentruns-tool-content");
  for (const item of items.slice(0, MAX_CONTENT_ITEMS)) {
    const shown = contentItem(item);
    if (shown !== null) box.appendChild(shown);
  }
  if (items.length > MAX_CONTENT_ITEMS) {
    box.appendChild(element("div", "agentruns-tool-more", `… and ${items.length - MAX_CONTENT_ITEMS} more`));
  }
  return box.childElementCount > 0 ? box : null;
}

/**
 * One item of a tool's content. A permission's tool comes as the agent's
 * adapter passed it, so ACP's own names (oldText, newText, a text inside
 * {type: "content"}) are read too.
 * @param {unknown} item
 * @returns {HTMLElement | null}
 */
function contentItem(item) {
  if (!isPlainObject(item)) return null;
  if (item.type === "diff" && typeof item.path === "string") {
    const newText = item.new_text ?? item.newText;
    const oldText = item.old_text ?? item.oldText ?? null;
    if (typeof newText === "string" && (oldText === null || typeof oldText === "string")) {
      return diffBlock(item.path, oldText, newText);
    }
  }
  const text = item.type === "content" && isPlainObject(item.content) ? item.content.text : item.type === "text" ? item.text : null;
  return typeof text === "string" ? textBlock(text) : null;
}

/**
 * @param {string} text
 * @returns {HTMLElement}
 */
export function textBlock(text) {
  const more = text.length - MAX_TOOL_TEXT_CHARS;
  const shown = more > 0 ? `${text.slice(0, MAX_TOOL_TEXT_CHARS)}\n… ${more.toLocaleString("en-US")} more characters` : text;
  return element("pre", "agentruns-tool-text", shown);
}

/**
 * A file's change as a unified diff: the file's name with the lines added and
 * removed, then each hunk with a few lines of context. A long one starts folded.
 * @param {string} path
 * @param {string | null} oldText null for a new file
 * @param {string} newText
 * @returns {HTMLElement}
 */
export function diffBlock(path, oldText, newText) {
  const { hunks, added, removed } = unifiedDiff(oldText, newText);
  const block = /** @type {HTMLDetailsElement} */ (element("details", "agentruns-diff"));
  block.dataset.path = path;
  const head = element("summary", "agentruns-diff-head");
  head.appendChild(element("span", "agentruns-diff-path", path));
  if (oldText === null) head.appendChild(element("span", "agentruns-diff-new", "new file"));
  head.append(element("span", "agentruns-diff-added", `+${added}`), element("span", "agentruns-diff-removed", `−${removed}`));
  const lines = element("div", "agentruns-diff-lines");
  let count = 0;
  let total = 0;
  for (const hunk of hunks) {
    total += hunk.lines.length + 1;
    if (count >= MAX_DIFF_LINES) continue;
    lines.appendChild(diffLine("@", hunkHeader(hunk)));
    count += 1;
    for (const line of hunk.lines.slice(0, MAX_DIFF_LINES - count)) lines.appendChild(diffLine(line.op, line.op + line.text));
    count += Math.min(hunk.lines.length, MAX_DIFF_LINES - count);
  }
  if (hunks.length === 0) lines.appendChild(diffLine("@", "no change"));
  if (total > count) lines.appendChild(diffLine("@", `… ${(total - count).toLocaleString("en-US")} more lines`));
  const body = element("div", "agentruns-diff-body");
  body.appendChild(lines);
  block.append(head, body);
  block.open = total <= DIFF_OPEN_LINES;
  return block;
}

/**
 * @param {string} op " ", "-", "+", or "@" for a hunk's header
 * @param {string} text
 */
function diffLine(op, text) {
  const line = element("div", "agentruns-diff-line", text);
  line.dataset.op = op === " " ? "context" : op === "-" ? "removed" : op === "+" ? "added" : "hunk";
  return line;
}

/**
 * A cost in the currency of the agent's prices: cents for most, more digits for a fraction of one.
 * @param {number} cost
 */
export function formatCost(cost) {
  if (cost === 0) return "0";
  return cost >= 0.01 ? cost.toFixed(2) : cost.toPrecision(2);
}

/**
 * A token count ("1234", or "1,234" grouped), or "?" for anything that is not one
 * (text, negative, fractional, beyond 2^53: a run's usage is what its agent said).
 * @param {unknown} value
 * @param {boolean} [grouped]
 * @returns {string}
 */
export function formatTokens(value, grouped = false) {
  if (!isTokenCount(value)) return "?";
  return grouped ? /** @type {number} */ (value).toLocaleString("en-US") : String(value);
}

/**
 * @param {unknown} value
 * @returns {boolean}
 */
export function isTokenCount(value) {
  return typeof value === "number" && Number.isInteger(value) && value >= 0 && value <= 2 ** 53;
}

/**
 * @param {unknown} cost
 * @returns {boolean}
 */
export function isCost(cost) {
  return typeof cost === "number" && Number.isFinite(cost) && cost >= 0;
}
