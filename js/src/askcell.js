// Ask about this cell: a question to an agent with a notebook cell's source
// and outputs as its context, in the notebook's conversation.
//
// Plain DOM and plain functions, no JupyterLab import: the labextension finds
// the cell and shows the form in a dialog, the tests build prompts from cells'
// JSON (nbformat) and drive the form in jsdom. The form is New run's, with the
// cell in place of the notebook field; its run opens in the conversation.

import { cutText, element } from "./dom.js";
import { NewRunForm, newRunBody } from "./newrun.js";

/**
 * @typedef {import("./newrun.js").NewRunOptions} NewRunOptions
 * @typedef {{cell_type?: string, source?: string | string[], outputs?: any[], execution_count?: number | null}} CellJson a cell as nbformat has it
 * @typedef {{cell: CellJson, index: number, notebook: string, language?: string, kernelId?: string | null}} AskedCell
 * `index`: the cell's place in the notebook (0 first); `kernelId`: the notebook's kernel, for the agent's notebook tools.
 */

/** The most characters of a cell (source and outputs together) a question carries. */
export const CELL_CONTEXT_CHARS = 20_000;
/** The characters of the cell's first line its label shows. */
const LABEL_LINE_CHARS = 60;

// CSI (colours, cursor moves) and OSC (titles, links) sequences, then any escape left.
const ANSI = /\u001b\[[0-?]*[ -/]*[@-~]|\u001b\][^\u0007\u001b]*(?:\u0007|\u001b\\)|\u001b[@-Z\\-_]/g;

/**
 * `text` without terminal escape sequences (a traceback's colours).
 * @param {string} text
 */
export function stripAnsi(text) {
  return text.replace(ANSI, "");
}

/**
 * Text as a terminal last showed it: a line rewritten after a carriage return
 * (a progress bar) keeps its last form only.
 * @param {string} text
 */
function settled(text) {
  return text
    .replace(/\r\n/g, "\n")
    .split("\n")
    .map((line) => line.slice(line.lastIndexOf("\r") + 1))
    .join("\n");
}

/**
 * nbformat's multiline string (a string or a list of lines) as one string.
 * @param {unknown} value
 * @returns {string}
 */
function joined(value) {
  if (typeof value === "string") return value;
  return Array.isArray(value) ? value.filter((part) => typeof part === "string").join("") : "";
}

/**
 * One output of a cell as text: a stream's text, a result's text/plain, an
 * error's name, value and traceback, without terminal colours; what has no
 * text (an image, HTML only) is named, not included.
 * @param {any} output
 * @returns {string}
 */
export function outputText(output) {
  if (output === null || typeof output !== "object") return "";
  if (output.output_type === "stream") return stripAnsi(settled(joined(output.text)));
  if (output.output_type === "error") {
    const head = `${output.ename ?? "Error"}: ${output.evalue ?? ""}`;
    const traceback = Array.isArray(output.traceback) ? output.traceback.map((/** @type {unknown} */ line) => stripAnsi(String(line))).join("\n") : "";
    return traceback.trim() ? `${head}\n${traceback}` : head;
  }
  const data = output.data !== null && typeof output.data === "object" ? output.data : {};
  const parts = [];
  if (typeof data["text/plain"] === "string" || Array.isArray(data["text/plain"])) parts.push(stripAnsi(joined(data["text/plain"])));
  const unshown = Object.keys(data).filter((mime) => mime !== "text/plain" && (mime.startsWith("image/") || !("text/plain" in data)));
  for (const mime of unshown) parts.push(`[${mime.startsWith("image/") ? "an image" : "an output"} (${mime}), not included]`);
  return parts.join("\n");
}

/**
 * "Cell 3 [5]: df.describe()": the cell's place, its execution count when it ran, and its first line.
 * @param {CellJson} cell
 * @param {number} index
 */
export function cellLabel(cell, index) {
  const count = typeof cell.execution_count === "number" ? ` [${cell.execution_count}]` : "";
  const first = joined(cell.source).split("\n").find((line) => line.trim()) ?? "";
  return `Cell ${index + 1}${count}: ${first.trim() ? cutText(first.trim(), LABEL_LINE_CHARS) : "(empty)"}`;
}

/**
 * `text` in at most `limit` characters: its start and its end, with a line in
 * between saying how much of `what` was cut there.
 * @param {string} text
 * @param {number} limit
 * @param {string} what
 */
export function clipMiddle(text, limit, what) {
  if (text.length <= limit) return text;
  const note = (/** @type {number} */ cut) => `\n[… ${cut.toLocaleString("en-US")} characters of the ${what} cut here …]\n`;
  const room = Math.max(0, limit - note(text.length).length);
  let head = Math.ceil(room / 2);
  let tail = text.length - Math.floor(room / 2);
  // Whole characters: an emoji is not cut in two.
  if (head > 0 && /[\ud800-\udbff]/.test(text[head - 1])) head -= 1;
  if (tail < text.length && /[\udc00-\udfff]/.test(text[tail])) tail += 1;
  return `${text.slice(0, head)}${note(tail - head)}${text.slice(tail)}`;
}

/**
 * A fence for `text` in Markdown: longer than any run of backticks in it.
 * @param {string} text
 */
function fence(text) {
  const longest = Math.max(0, ...Array.from(text.matchAll(/`+/g), (found) => found[0].length));
  return "`".repeat(Math.max(3, longest + 1));
}

/**
 * `text` fenced as a Markdown code block.
 * @param {string} text
 * @param {string} [language]
 */
function fenced(text, language = "") {
  const marks = fence(text);
  return `${marks}${language}\n${text.replace(/\n$/, "")}\n${marks}`;
}

/**
 * The prompt of a question about a cell: the question, then the cell's source
 * and its outputs as text, fenced, together at most `limit` characters (the
 * middle of each cut, saying so, when the cell is longer).
 * @param {string} question
 * @param {AskedCell} asked
 * @param {number} [limit]
 * @returns {string}
 */
export function cellPrompt(question, asked, limit = CELL_CONTEXT_CHARS) {
  const { cell, index, notebook } = asked;
  const markdown = cell.cell_type === "markdown";
  const source = joined(cell.source);
  const outputs = (Array.isArray(cell.outputs) ? cell.outputs : []).map(outputText).filter((text) => text.trim());
  const output = outputs.join("\n");
  // The source keeps at least half when both are long; either takes what the other leaves.
  const sourceRoom = Math.max(limit - output.length, Math.ceil(limit / 2));
  const shownSource = clipMiddle(source, sourceRoom, "source");
  const shownOutput = clipMiddle(output, Math.max(0, limit - shownSource.length), "output");
  const count = typeof cell.execution_count === "number" ? `, In [${cell.execution_count}]` : "";
  const kind = markdown ? "markdown cell" : cell.cell_type === "raw" ? "raw cell" : "cell";
  const parts = [question.trim(), "", `This is about ${kind} ${index + 1}${count} of the notebook ${notebook}. Its source:`, "", fenced(shownSource, markdown ? "markdown" : asked.language || "")];
  if (cell.cell_type === "code" || cell.cell_type === undefined) {
    parts.push("", ...(output.trim() ? ["Its output:", "", fenced(shownOutput)] : ["It has no output."]));
  }
  return parts.join("\n");
}

/**
 * The body of `POST runs` for a question about a cell, in the notebook's conversation, or why it cannot be one.
 * @param {{agent: string, question: string, asked: AskedCell, chosen?: {mode?: string, model?: string}, files?: string[]}} fields
 */
export function askBody({ agent, question, asked, chosen = {}, files = [] }) {
  if (!question.trim()) return { body: null, problem: "Write your question about the cell." };
  const made = newRunBody({ agent, prompt: cellPrompt(question, asked), notebook: asked.notebook, chosen, files });
  if (made.body !== null && made.body.metadata && asked.kernelId) {
    // The kernel the agent's notebook tools act on, as a cell's run has it.
    made.body.metadata = { ...made.body.metadata, kernel_id: asked.kernelId };
  }
  return made;
}

/** New run's form asking about one cell: the agent, the question, and which cell goes with it. */
export class AskCellForm extends NewRunForm {
  /**
   * @param {NewRunOptions & {asked: AskedCell, openConversation: (session: string, agent: string, runId: string) => void}} options
   */
  constructor(options) {
    super(options);
    this.asked = options.asked;
    this.openConversation = options.openConversation;
    this.node.classList.add("agentruns-askcell");
    this.node.setAttribute("aria-label", "Ask an agent about this cell");
    this.prompt.placeholder = "Your question about this cell (Enter sends it, Shift+Enter a new line)";
    this.startButton.textContent = "Ask";
    const notebookField = this.notebook.closest("label");
    if (notebookField) notebookField.hidden = true;
    this.notebook.value = this.asked.notebook;
    const label = cellLabel(this.asked.cell, this.asked.index);
    this.context = element("div", "agentruns-askcell-context");
    this.context.append(element("span", "agentruns-newrun-label", "About"), element("span", "agentruns-askcell-cell", label));
    this.context.title = `${label}\nIts source and outputs (as text, at most ${CELL_CONTEXT_CHARS.toLocaleString("en-US")} characters) go with the question.`;
    const promptField = this.prompt.closest("label");
    const questionLabel = promptField?.querySelector(".agentruns-newrun-label");
    if (questionLabel) questionLabel.textContent = "Question";
    this.node.insertBefore(this.context, promptField ? promptField.nextSibling : null);
  }

  /** @param {string[]} [files] */
  body(files = []) {
    return askBody({ agent: this.agent.value, question: this.prompt.value, asked: this.asked, chosen: this.pickers.chosen(), files });
  }

  /** @param {import("./runstate.js").Run} run */
  started(run) {
    this.openConversation(typeof run.session === "string" && run.session ? run.session : this.asked.notebook, run.agent, run.run_id);
  }
}
