// A run's notebook edits as a person reads them: what each did, in words,
// its status, the diff of its cell, and Undo (each, or all of them).
//
// The snapshot keeps them under `edits`, one entry per edit_id in the order
// they were first made, each the last word on that edit. The run view shows
// this section (in a notebook, the JupyterLab renderer and a run's page);
// the runs panel counts them.

import { button, diffBlock, element } from "./dom.js";
import { compactJson, isPlainObject } from "./json.js";

/**
 * @typedef {{
 *   edit_id: string, notebook?: string | null, op: string, cell_id?: string | null, index?: number | null,
 *   before?: unknown, after?: unknown, status: string,
 * }} Edit
 * @typedef {(edit: Edit) => Promise<string | null>} Undo undoes one edit: null, or why not in words
 * @typedef {{undone: number, left: number, stoppedAt: Edit | null, problem: string | null}} UndoAllOutcome
 */

/** What each operation did, and its noun for when it was not applied. */
/** @type {Record<string, {did: string, noun: string}>} */
const OPERATIONS = {
  insert: { did: "Inserted", noun: "insertion" },
  edit: { did: "Edited", noun: "edit" },
  delete: { did: "Deleted", noun: "deletion" },
  outputs: { did: "Ran", noun: "outputs" },
};

/**
 * The edits of a snapshot, each one an object with an id (an older snapshot has none).
 * @param {unknown} snapshot
 * @returns {Edit[]}
 */
export function runEdits(snapshot) {
  const edits = isPlainObject(snapshot) && Array.isArray(snapshot.edits) ? snapshot.edits : [];
  return edits.filter((edit) => isPlainObject(edit) && typeof edit.edit_id === "string");
}

/**
 * "cell 3" (the index counts from 0, a person from 1), or "a cell" when it is not known.
 * @param {Edit} edit
 * @returns {string}
 */
function cellWords(edit) {
  return Number.isSafeInteger(edit.index) && /** @type {number} */ (edit.index) >= 0 ? `cell ${/** @type {number} */ (edit.index) + 1}` : "a cell";
}

/**
 * What an edit did, in words: "Inserted cell 3", "Edited cell 2", "Deleted cell 4",
 * "Ran cell 1" (its outputs), or, when it was not applied, "Conflict: the cell changed".
 * @param {Edit} edit
 * @returns {string}
 */
export function editWords(edit) {
  const operation = OPERATIONS[edit.op] ?? { did: "Changed", noun: "change" };
  if (edit.status === "conflict") return `Conflict: the cell changed; the ${operation.noun} of ${cellWords(edit)} was not applied`;
  return `${operation.did} ${cellWords(edit)}`;
}

/**
 * "1 edit", "3 edits".
 * @param {number} count
 * @returns {string}
 */
export function editCountWords(count) {
  return `${count} edit${count === 1 ? "" : "s"}`;
}

/**
 * "3 edits · 1 undone", or "" for none: the section's head and the runs panel's rows say it.
 * @param {Edit[]} edits
 * @returns {string}
 */
export function editsSummary(edits) {
  if (edits.length === 0) return "";
  const undone = edits.filter((edit) => edit.status === "undone").length;
  return undone > 0 ? `${editCountWords(edits.length)} · ${undone} undone` : editCountWords(edits.length);
}

/**
 * The text a diff compares for one side of an edit: the cell's source, or its outputs as they read.
 * @param {string} op
 * @param {unknown} side
 * @returns {string}
 */
export function sideText(op, side) {
  if (side === null || side === undefined) return "";
  if (typeof side === "string") return side;
  if (op === "outputs" && Array.isArray(side)) return side.map(outputText).join("");
  // nbformat keeps a source as a list of lines, each with its newline.
  if (Array.isArray(side) && side.every((line) => typeof line === "string")) return side.join("");
  return JSON.stringify(side, null, 2) ?? String(side);
}

/**
 * One nbformat output as a person reads it in a diff: its text, or its kinds of data.
 * @param {unknown} output
 * @returns {string}
 */
function outputText(output) {
  /** @param {unknown} value */
  const joined = (value) => (Array.isArray(value) ? value.join("") : typeof value === "string" ? value : "");
  /** @param {string} text */
  const line = (text) => (text === "" || text.endsWith("\n") ? text : `${text}\n`);
  if (!isPlainObject(output)) return line(compactJson(output, 200));
  if (output.output_type === "stream") return line(joined(output.text));
  if (output.output_type === "error") return line(`${output.ename}: ${output.evalue}`);
  const data = isPlainObject(output.data) ? output.data : {};
  if (typeof data["text/plain"] === "string" || Array.isArray(data["text/plain"])) return line(joined(data["text/plain"]));
  const kinds = Object.keys(data);
  return line(`[${kinds.length > 0 ? kinds.join(", ") : String(output.output_type || "output")}]`);
}

/** How many lines of an outputs edit's text its card shows, and how long each may be. */
const OUTPUT_LINES = 3;
const OUTPUT_LINE_CHARS = 120;

/**
 * Whether an nbformat output shows an image.
 * @param {unknown} output
 * @returns {boolean}
 */
function isImage(output) {
  return isPlainObject(output) && isPlainObject(output.data) && Object.keys(output.data).some((mime) => mime.startsWith("image/"));
}

/**
 * What an outputs edit (execute_cell) put into its cell, in words: "3 outputs · 1 image",
 * and the first lines of their text (an image counted, not shown).
 * @param {Edit} edit
 * @returns {{count: string, lines: string[]}}
 */
export function outputsSummary(edit) {
  const outputs = Array.isArray(edit.after) ? edit.after : [];
  const images = outputs.filter(isImage).length;
  let count = outputs.length === 0 ? "no output" : `${outputs.length} output${outputs.length === 1 ? "" : "s"}`;
  if (images > 0) count += ` · ${images} image${images === 1 ? "" : "s"}`;
  const all = outputs
    .filter((output) => !isImage(output))
    .map(outputText)
    .join("")
    .split("\n")
    .filter((line) => line.trim() !== "");
  const lines = all.slice(0, OUTPUT_LINES).map((line) => (line.length > OUTPUT_LINE_CHARS ? `${line.slice(0, OUTPUT_LINE_CHARS)}…` : line));
  if (all.length > OUTPUT_LINES) lines.push(`… ${all.length - OUTPUT_LINES} more line${all.length - OUTPUT_LINES === 1 ? "" : "s"}`);
  return { count, lines };
}

/**
 * The edits Undo all undoes, in its order: the applied ones, newest first.
 * @param {Edit[]} edits
 * @returns {Edit[]}
 */
export function undoOrder(edits) {
  return edits.filter((edit) => edit.status === "applied").reverse();
}

/**
 * Undo the applied edits newest first, one at a time, stopping at the first
 * that cannot be undone (its cell changed since): older edits are undone only
 * over a notebook that holds what they wrote.
 * @param {Edit[]} edits
 * @param {Undo} undo
 * @returns {Promise<UndoAllOutcome>}
 */
export async function undoAll(edits, undo) {
  const order = undoOrder(edits);
  let undone = 0;
  for (const edit of order) {
    const problem = await undo(edit);
    if (problem !== null) return { undone, left: order.length - undone, stoppedAt: edit, problem };
    undone += 1;
  }
  return { undone, left: 0, stoppedAt: null, problem: null };
}

/**
 * What Undo all did, in words.
 * @param {UndoAllOutcome} outcome
 * @returns {string}
 */
export function undoAllWords({ undone, left, stoppedAt, problem }) {
  if (stoppedAt === null) return undone === 0 ? "Nothing to undo." : `Undid ${editCountWords(undone)}.`;
  const start = undone === 0 ? "Undo all stopped" : `Undid ${editCountWords(undone)}, then stopped`;
  const older = left - 1;
  const kept = older > 0 ? ` ${older === 1 ? "1 older edit stays" : `${older} older edits stay`} applied.` : "";
  return `${start} at “${editWords(stoppedAt)}”: ${String(problem).replace(/[.\s]+$/, "")}.${kept}`;
}

/**
 * One edit: what it did, its status, Undo while it is applied, and the diff of its cell.
 * @param {Edit} edit
 * @param {(edit: Edit, node: HTMLButtonElement) => void} undo
 * @returns {HTMLElement}
 */
export function editCard(edit, undo) {
  const card = element("div", "agentruns-edit");
  card.dataset.editId = edit.edit_id;
  card.dataset.status = String(edit.status);
  card.dataset.op = String(edit.op);
  const head = element("div", "agentruns-edit-head");
  const words = element("span", "agentruns-edit-words", editWords(edit));
  if (typeof edit.cell_id === "string") words.title = `cell id ${edit.cell_id}`;
  const status = element("span", "agentruns-edit-status", String(edit.status));
  status.dataset.status = String(edit.status);
  head.append(words, status, element("span", "agentruns-spacer"));
  if (edit.status === "applied") {
    const node = button("Undo", "agentruns-undo");
    node.title = edit.op === "outputs" ? "Put back the outputs the cell had before the agent ran it" : "Put the cell back as it was before this edit";
    // Each card has its Undo: a screen reader names which edit it takes back.
    node.setAttribute("aria-label", `Undo: ${editWords(edit)}`);
    node.addEventListener("click", () => undo(edit, node));
    head.appendChild(node);
  }
  card.appendChild(head);
  if (edit.op === "outputs") {
    // What running the cell showed, at a glance; the diff below has the rest.
    const { count, lines } = outputsSummary(edit);
    const shown = element("div", "agentruns-edit-outputs");
    shown.append(element("span", "agentruns-edit-outputs-count", `Ran the cell: ${count}`));
    if (lines.length > 0) shown.append(element("pre", "agentruns-edit-outputs-text", lines.join("\n")));
    card.appendChild(shown);
  }
  const notebook = typeof edit.notebook === "string" && edit.notebook ? edit.notebook : "notebook";
  card.appendChild(diffBlock(notebook, sideText(edit.op, edit.before), sideText(edit.op, edit.after)));
  return card;
}

/** The section of a run's view that lists its notebook edits, with Undo and Undo all. */
export class EditsSection {
  /** @param {Undo} undo how one edit is undone (through the page's RunActions) */
  constructor(undo) {
    this.undo = undo;
    this.node = element("div", "agentruns-edits");
    const head = element("div", "agentruns-edits-head");
    this.count = element("span", "agentruns-edits-count");
    this.undoAllButton = button("Undo all", "agentruns-undo-all");
    this.undoAllButton.title = "Undo the applied edits, newest first";
    this.undoAllButton.addEventListener("click", () => void this.undoAll());
    head.append(element("span", "agentruns-edits-title", "Notebook edits"), this.count, element("span", "agentruns-spacer"), this.undoAllButton);
    this.note = element("div", "agentruns-edits-note");
    this.note.hidden = true;
    this.list = element("div", "agentruns-edits-list");
    this.node.append(head, this.note, this.list);
    this.node.hidden = true;
    /** @type {Edit[]} */
    this.edits = [];
    /** @type {{edit: Edit, status: string, node: HTMLElement}[]} */
    this.cards = [];
    this.undoingAll = false;
  }

  /** Forget the cards drawn (the view shows another snapshot). */
  reset() {
    this.cards = [];
    this.list.replaceChildren();
  }

  /**
   * Draw `edits`: only the cards of edits that changed are drawn again.
   * @param {Edit[]} edits
   */
  render(edits) {
    this.edits = edits;
    edits.forEach((edit, index) => {
      const card = this.cards[index];
      if (card && card.edit === edit && card.status === edit.status) return;
      const node = editCard(edit, (shown, undo) => void this.undoOne(shown, undo));
      if (card) {
        // A diff the person opened or folded stays so when its status changes.
        const [before, after] = [card.node, node].map((each) => each.querySelector("details"));
        if (before && after && card.edit.edit_id === edit.edit_id) /** @type {HTMLDetailsElement} */ (after).open = /** @type {HTMLDetailsElement} */ (before).open;
        card.node.replaceWith(node);
      } else {
        this.list.appendChild(node);
      }
      this.cards[index] = { edit, status: edit.status, node };
    });
    for (const card of this.cards.splice(edits.length)) card.node.remove();
    this.node.hidden = edits.length === 0;
    this.count.textContent = editsSummary(edits);
    this.undoAllButton.hidden = undoOrder(edits).length === 0;
    this.undoAllButton.disabled = this.undoingAll;
  }

  /**
   * Undo one edit from its button; says why not when the server refuses.
   * @param {Edit} edit
   * @param {HTMLButtonElement} node
   */
  async undoOne(edit, node) {
    if (node.dataset.sending === "true") return;
    node.dataset.sending = "true";
    node.disabled = true;
    this._say(null);
    try {
      const problem = await this.undo(edit);
      if (problem !== null) this._say(`Cannot undo “${editWords(edit)}”: ${problem}`);
    } finally {
      // The edit's undone status redraws its card; until then (or after a refusal) it can be used again.
      node.dataset.sending = "false";
      node.disabled = false;
    }
  }

  /** Undo every applied edit, newest first, stopping at the first that cannot be; says what it did. */
  async undoAll() {
    if (this.undoingAll) return;
    this.undoingAll = true;
    this.undoAllButton.disabled = true;
    this._say(null);
    try {
      this._say(undoAllWords(await undoAll(this.edits, this.undo)));
    } finally {
      this.undoingAll = false;
      this.undoAllButton.disabled = false;
    }
  }

  /** @param {string | null} text */
  _say(text) {
    this.note.hidden = text === null;
    this.note.textContent = text ?? "";
  }
}
