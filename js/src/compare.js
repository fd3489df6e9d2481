// Two runs side by side: what each was asked and cost, their steps aligned, their answers diffed.
//
// Opened from a fork's view ("Compare with the original") or from the runs
// panel (two runs selected). It reads each run once (GET runs/{id}); Reload
// reads them again, for a run that was still going.

import { apiFetch, errorMessage, runsUrl } from "./api.js";
import { button, diffBlock, element, formatCost, formatTokens, isCost, parseTime } from "./dom.js";
import { compactJson, isPlainObject } from "./json.js";
import { stepStarts } from "./retry.js";
import { formatDuration, runTitle } from "./words.js";

/**
 * @typedef {import("./api.js").Fetch} Fetch
 * @typedef {{label: string, value: (run: any) => string}} Fact
 */

// A fork's side of a step its original made before the fork: carried over, not made again.
const BEFORE_THE_FORK = "(before the fork)";

/** Sent (detail `{left, right}`: run ids) when a person asks to compare two runs. */
export const COMPARE_EVENT = "agentruns:compare";

/**
 * Ask for the comparison of two runs (the labextension opens it in the main area).
 * @param {string} left
 * @param {string} right
 */
export function requestCompare(left, right) {
  document.dispatchEvent(new CustomEvent(COMPARE_EVENT, { detail: { left, right } }));
}

/**
 * The answer a run gave, as text: its output's `text`, else its messages' text, else its output as JSON.
 * @param {any} run
 * @returns {string}
 */
export function answerText(run) {
  const output = run?.output;
  if (isPlainObject(output) && typeof output.text === "string") return output.text;
  const messages = Array.isArray(run?.snapshot?.messages) ? run.snapshot.messages : [];
  /** @type {string[]} */
  const said = messages.filter((/** @type {any} */ m) => m?.role !== "user").map((/** @type {any} */ m) => String(m.text ?? ""));
  if (said.some((text) => text !== "")) return said.join("\n\n");
  if (output === null || output === undefined) return "";
  return typeof output === "string" ? output : JSON.stringify(output, null, 2);
}

/**
 * How long a run took (started to finished, or to now while it goes on), or "" when it never started.
 * @param {any} run
 * @param {number} now
 */
export function runTime(run, now = Date.now()) {
  const started = parseTime(run?.started_at);
  if (started === null) return "";
  const finished = parseTime(run?.finished_at);
  return formatDuration(Math.max(0, (finished ?? now) - started));
}

/** @type {Fact[]} */
const FACTS = [
  { label: "Agent", value: (run) => String(run.agent ?? "") },
  { label: "Status", value: (run) => String(run.status ?? "") },
  { label: "Model", value: (run) => String(run.input?.model ?? run.output?.model ?? "") },
  { label: "Input tokens", value: (run) => (run.snapshot?.usage ? formatTokens(run.snapshot.usage.input_tokens, true) : "") },
  { label: "Output tokens", value: (run) => (run.snapshot?.usage ? formatTokens(run.snapshot.usage.output_tokens, true) : "") },
  { label: "Cost", value: (run) => (isCost(run.snapshot?.usage?.cost) ? formatCost(run.snapshot.usage.cost) : "") },
  { label: "Time", value: (run) => runTime(run) },
  { label: "Steps", value: (run) => String(Array.isArray(run.snapshot?.tools) ? run.snapshot.tools.length : 0) },
  {
    label: "Forked from",
    value: (run) => (isPlainObject(run.forked_from) ? `${run.forked_from.run_id} after event ${run.forked_from.seq}` : ""),
  },
];

/**
 * A step as one line: its title, else its name and arguments, and how it ended.
 * @param {any} step
 */
export function stepLine(step) {
  if (!isPlainObject(step)) return "";
  const what = typeof step.title === "string" && step.title ? step.title : `${step.name} ${compactJson(step.args, 120)}`;
  return `${what} · ${step.status}`;
}

/** Two runs side by side. */
export class ComparePage {
  /**
   * @param {{baseUrl: string, left: string, right: string, openRun?: (runId: string) => void, fetch?: Fetch}} options
   */
  constructor(options) {
    this.baseUrl = options.baseUrl;
    this.ids = [options.left, options.right];
    this.openRun = options.openRun ?? null;
    this.fetch = options.fetch ?? apiFetch;
    /** @type {any[] | null} */
    this.runs = null;
    this.node = element("div", "agentruns-compare");
    this.node.dataset.left = options.left;
    this.node.dataset.right = options.right;
    this.note = element("div", "agentruns-compare-note");
    this.node.appendChild(this.note);
  }

  /** Read both runs and draw them; what went wrong is said on the page. */
  async load() {
    this.note.textContent = "Loading…";
    /** @type {[number, number]} */
    const shift = [0, 0];
    try {
      const runs = await Promise.all(this.ids.map((id) => this._read(id)));
      // A fork's steps start where it was forked: aligned after the original's steps until then.
      for (const [fork, original] of [[1, 0], [0, 1]]) {
        const from = runs[fork].forked_from;
        if (isPlainObject(from) && from.run_id === runs[original].run_id) {
          shift[fork] = (await stepStarts(this.baseUrl, from.run_id, { upto: Number(from.seq) }, this.fetch)).length;
          break;
        }
      }
      this.runs = runs;
    } catch (error) {
      this.note.textContent = `Cannot compare: ${error instanceof Error ? error.message : String(error)}`;
      return;
    }
    this._render(/** @type {any[]} */ (this.runs), shift);
  }

  /** @param {string} runId */
  async _read(runId) {
    const response = await this.fetch(runsUrl(this.baseUrl, runId));
    if (!response.ok) throw new Error(`${runId}: ${await errorMessage(response)}`);
    return response.json();
  }

  /**
   * @param {any[]} runs
   * @param {[number, number]} shift steps of each side that are the other's (a fork's: before it)
   */
  _render(runs, shift) {
    this.node.replaceChildren();
    const head = element("div", "agentruns-compare-head");
    const reload = button("Reload", "agentruns-compare-reload");
    reload.title = "Read both runs again";
    reload.addEventListener("click", () => void this.load());
    head.append(element("span", "agentruns-compare-heading", "Compare runs"), reload);

    const table = element("table", "agentruns-compare-table");
    const titles = element("tr", "agentruns-compare-titles");
    titles.append(element("th", "", ""), ...runs.map((run) => this._titleCell(run)));
    table.appendChild(titles);
    for (const fact of FACTS) {
      const values = runs.map((run) => fact.value(run));
      if (values.every((value) => value === "")) continue;
      table.appendChild(this._row(fact.label, values, "agentruns-compare-fact"));
    }

    // Steps aligned by their place in each run: a row differs when the two steps do.
    const steps = element("table", "agentruns-compare-table agentruns-compare-steps");
    const sides = runs.map((run) => (Array.isArray(run.snapshot?.tools) ? run.snapshot.tools : []));
    const count = Math.max(sides[0].length + shift[0], sides[1].length + shift[1]);
    for (let index = 0; index < count; index++) {
      const lines = [0, 1].map((side) => (index < shift[side] ? BEFORE_THE_FORK : stepLine(sides[side][index - shift[side]])));
      const row = this._row(String(index + 1), lines, "agentruns-compare-step");
      if (lines.includes(BEFORE_THE_FORK)) row.classList.remove("agentruns-compare-differs");
      steps.appendChild(row);
    }

    const answers = element("div", "agentruns-compare-answers");
    const [leftText, rightText] = runs.map(answerText);
    answers.appendChild(element("div", "agentruns-compare-section", "Answers"));
    const sideBySide = element("div", "agentruns-compare-columns");
    for (const text of [leftText, rightText]) sideBySide.appendChild(element("pre", "agentruns-compare-answer", text || "(no answer)"));
    answers.append(sideBySide, diffBlock("answer", leftText, rightText));

    const stepsSection = element("div", "agentruns-compare-section", count ? `Steps (${count})` : "No steps");
    this.node.append(head, table, stepsSection, steps, answers);
  }

  /** @param {any} run */
  _titleCell(run) {
    const cell = element("th", "");
    const title = element("div", "agentruns-compare-title");
    const link = button(runTitle(run) || run.run_id, "agentruns-compare-run");
    link.title = `Open ${run.run_id}`;
    link.addEventListener("click", () => this.openRun?.(run.run_id));
    title.append(link, element("code", "agentruns-compare-id", run.run_id));
    cell.appendChild(title);
    return cell;
  }

  /**
   * @param {string} label
   * @param {string[]} values
   * @param {string} className
   */
  _row(label, values, className) {
    const row = element("tr", className);
    if (values[0] !== values[1]) row.classList.add("agentruns-compare-differs");
    row.append(element("th", "agentruns-compare-label", label), ...values.map((value) => element("td", "agentruns-compare-value", value)));
    return row;
  }
}
