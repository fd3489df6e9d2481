
// A run's own page: what it was asked, its live view (the notebook edits it
// made among it), its timeline, its attempts, and what can be done with it
// (go to its cell, delete it).
//
// Plain DOM, no JupyterLab import: the labextension puts it in a main-area
// tab (labextension.js), the tests drive it in jsdom. The live part (status,
// answer, tools, tokens and cost, Cancel, Run again) is the run view the
// notebooks show; the timeline reads the run's events through the REST API,
// a page at a time.

import { apiFetch, errorMessage, runsUrl, withSlash } from "./api.js";
import { requestCompare } from "./compare.js";
import { TITLE_CHARS, button, cutText, element, formatCost, formatTokens, isCost, parseTime } from "./dom.js";
import { editWords } from "./edits.js";
import { pageHost } from "./hosts.js";
import { isPlainObject } from "./json.js";
import { RUN_DELETED_EVENT } from "./links.js";
import { isTerminalType } from "./status.js";
import { silenceWords } from "./silence.js";
import { RunView, eventSummary } from "./view.js";
import { answerWords, cancelledWords, clockTime, formatDuration, runTitle } from "./words.js";

/** Events read per page of the timeline. */
export const TIMELINE_PAGE = 500;
/** Runs of a `retry_of` chain followed back at most. */
export const MAX_CHAIN = 20;
/** The forks of a run its page lists at most (the newest). */
export const MAX_FORKS = 20;
/** How often the page looks whether its run's agent is silent, and reads its stderr again while it is. */
export const STDERR_CHECK_MS = 10_000;

/**
 * @typedef {{seq: number, type: string, ts: string, data: any}} Envelope
 * @typedef {{seq: number, last: number, type: string, ts: string, text: string, count: number}} Entry
 * @typedef {{
 *   baseUrl: string,
 *   runId: string,
 *   openRun?: (runId: string) => void,
 *   openCell?: (path: string, cellId: string | null) => void | Promise<void>,
 *   pageSize?: number,
 * }} RunPageOptions
 */

/**
 * "4 steps", "1 step".
 * @param {number} count
 * @param {string} word
 */
function plural(count, word) {
  return `${count} ${word}${count === 1 ? "" : "s"}`;
}

/**
 * One line of the timeline for an event, or null for one folded into its neighbours.
 * @param {Envelope} event
 * @param {Map<string, any>} asked the questions asked so far, by request id (filled here)
 * @param {Map<string, string>} tools the tools started so far, name by call id (filled here)
 * @returns {string | null}
 */
export function eventWords(event, asked, tools) {
  const data = isPlainObject(event.data) ? event.data : {};
  switch (event.type) {
    case "run.started":
      return "started";
    case "message.started":
    case "message.completed":
      return null;
    case "tool.started": {
      const name = typeof data.name === "string" ? data.name : "a tool";
      if (typeof data.call_id === "string") tools.set(data.call_id, name);
      const title = typeof data.title === "string" && data.title ? `: ${data.title}` : "";
      return `tool ${name} started${title}`;
    }
    case "tool.completed": {
      const name = tools.get(data.call_id) || "step";
      if (data.ok === false) {
        const error = isPlainObject(data.error) && typeof data.error.message === "string" ? data.error.message : "";
        return `tool ${name} failed${error ? `: ${error}` : ""}`;
      }
      return `tool ${name} completed`;
    }
    case "progress": {
      const fraction = typeof data.fraction === "number" ? `${Math.round(data.fraction * 100)}%` : "";
      const message = typeof data.message === "string" ? data.message : "";
      return `progress ${[fraction, message].filter(Boolean).join(": ")}`.trim();
    }
    case "usage": {
      const total = [data.input_tokens, data.output_tokens];
      let text = `usage: ${formatTokens(data.input_tokens, true)} in · ${formatTokens(data.output_tokens, true)} out`;
      if (total.every((value) => typeof value === "number")) text = `usage: ${formatTokens(total[0] + total[1], true)} tokens (${formatTokens(total[0], true)} in · ${formatTokens(total[1], true)} out)`;
      if (isCost(data.cost)) text += ` · cost ${formatCost(data.cost)}`;
      if (data.estimated === true) text = text.replace("usage: ", "usage: ≈ ") + " (estimated)";
      return text;
    }
    case "run.cancel_requested":
      return `cancel requested${typeof data.reason === "string" && data.reason ? `: ${data.reason}` : ""}`;
    case "input.requested": {
      if (data.request_id !== undefined) asked.set(String(data.request_id), data);
      return `asked: ${typeof data.title === "string" ? data.title : "a question"}`;
    }
    case "input.resolved": {
      const question = asked.get(String(data.request_id)) || {};
      const title = typeof question.title === "string" ? `${question.title}: ` : "";
      return `answered ${title}${answerWords({ ...question, ...data, status: "resolved" })}`;
    }
    case "run.resumed":
      return `resumed (attempt ${data.attempt})${typeof data.reason === "string" && data.reason ? `: ${data.reason}` : ""}`;
    case "notebook.edit":
      // The first event of an edit and each change of its status (applied, undone, ...): a line each.
      return `${editWords(/** @type {import("./edits.js").Edit} */ (data))} · ${typeof data.status === "string" ? data.status : "?"}`;
    case "plan.updated":
      return `plan: ${plural(Array.isArray(data.entries) ? data.entries.length : 0, "step")}`;
    case "run.succeeded":
      return "succeeded";
    case "run.failed": {
      const error = isPlainObject(data.error) && typeof data.error.message === "string" ? data.error.message : "";
      return `failed${error ? `: ${error}` : ""}`;
    }
    case "run.cancelled":
      return cancelledWords(data.reason);
    case "run.interrupted":
      return `interrupted${typeof data.reason === "string" && data.reason ? `: ${data.reason}` : ""}`;
    default:
      return `${event.type}: ${eventSummary(event.data)}`;
  }
}

/**
 * What folds into an entry already made: the deltas of one message, and the
 * progress and usage reports that follow each other (each replaces the last),
 * until a step a person cares about comes between them.
 * @param {Envelope} event
 * @returns {string | null}
 */
function foldKey(event) {
  if (event.type === "text.delta" || event.type === "reasoning.delta") {
    const data = isPlainObject(event.data) ? event.data : {};
    return `${event.type}:${typeof data.message_id === "string" ? data.message_id : ""}`;
  }
  return event.type === "progress" || event.type === "usage" ? event.type : null;
}

/**
 * The timeline of a run's events: one entry per step a person cares about.
 * The text of one message makes one entry ("wrote 420 characters"); progress
 * and usage reports between two steps make one each (the last one said).
 * @param {Envelope[]} events in seq order
 * @param {Entry[]} [entries] the entries so far (a later page continues them)
 * @param {{asked: Map<string, any>, tools: Map<string, string>, folds?: Map<string, Entry>}} [memory]
 * @returns {Entry[]}
 */
export function timelineEntries(events, entries = [], memory = { asked: new Map(), tools: new Map() }) {
  const folds = memory.folds || (memory.folds = new Map());
  for (const event of events) {
    if (!event || typeof event.seq !== "number" || typeof event.type !== "string") continue;
    const key = foldKey(event);
    const folded = key === null ? undefined : folds.get(key);
    const entry = folded || { seq: event.seq, last: event.seq, type: event.type, ts: event.ts, text: "", count: 0 };
    if (event.type === "text.delta" || event.type === "reasoning.delta") {
      const delta = isPlainObject(event.data) && typeof event.data.delta === "string" ? event.data.delta : "";
      entry.count += [...delta].length;
      entry.text = `${event.type === "text.delta" ? "wrote" : "thought"} ${plural(entry.count, "character")}`;
    } else {
      const text = eventWords(event, memory.asked, memory.tools);
      if (text === null) continue;
      entry.text = text;
    }
    entry.last = event.seq;
    if (folded !== undefined) continue;
    entries.push(entry);
    if (key !== null) folds.set(key, entry);
    else folds.clear();
  }
  return entries;
}

/**
 * "+1.4 s": when an event came, counted from the run's creation.
 * @param {string} ts
 * @param {number | null} start
 */
export function offsetWords(ts, start) {
  const at = parseTime(ts);
  if (at === null || start === null) return "";
  return `+${formatDuration(Math.max(0, at - start))}`;
}

/**
 * Where a run was started: its notebook (relative to the server's root) and its cell, if it says.
 * @param {any} run
 * @returns {{path: string | null, cellId: string | null}}
 */
export function runCell(run) {
  const metadata = run && isPlainObject(run.metadata) ? run.metadata : {};
  const fromSession = run && typeof run.session === "string" && run.session ? run.session : null;
  const notebook = typeof metadata.notebook === "string" && metadata.notebook ? metadata.notebook : fromSession;
  // A path on disk (an old run's absolute session) opens nothing in the file browser.
  const path = notebook !== null && !notebook.startsWith("/") && !/^[a-z]+:/i.test(notebook) ? notebook : null;
  const cellId = typeof metadata.cell_id === "string" && metadata.cell_id ? metadata.cell_id : null;
  return { path, cellId };
}

export class RunPage {
  /** @param {RunPageOptions} options */
  constructor(options) {
    this.baseUrl = withSlash(options.baseUrl);
    this.runId = options.runId;
    this.openRun = options.openRun || null;
    this.openCell = options.openCell || null;
    this.pageSize = options.pageSize || TIMELINE_PAGE;
    /** @type {any} */
    this.run = null;
    /** @type {Entry[]} */
    this.entries = [];
    this.memory = { asked: new Map(), tools: new Map() };
    this.cursor = 0;
    this.complete = false;
    /** @type {Promise<void> | null} */
    this.reading = null;
    this.disposed = false;
    /** @type {string | null} the edit to bring into view once drawn ("" for the edits' section) */
    this.wantedEdit = null;

    this.node = element("div", "agentruns-runpage");
    this.node.dataset.runId = this.runId;
    const head = element("div", "agentruns-runpage-head");
    this.titleNode = element("h2", "agentruns-runpage-title", this.runId);
    this.where = element("div", "agentruns-runpage-where");
    const actions = element("div", "agentruns-runpage-actions");
    this.cellButton = button("Go to cell", "agentruns-runpage-cell");
    this.cellButton.addEventListener("click", () => void this.goToCell());
    this.deleteButton = button("Delete", "agentruns-runpage-delete");
    this.deleteButton.addEventListener("click", () => this._askDelete());
    this.confirm = element("span", "agentruns-runpage-confirm");
    this.confirm.hidden = true;
    const yes = button("Delete this run", "agentruns-runpage-delete-yes");
    yes.addEventListener("click", () => void this.delete());
    const no = button("Keep it", "agentruns-runpage-delete-no");
    no.addEventListener("click", () => {
      this.confirm.hidden = true;
      this.deleteButton.hidden = false;
    });
    this.confirm.append(element("span", "agentruns-runpage-confirm-text", "Delete this run and its events for good?"), yes, no);
    actions.append(this.cellButton, this.deleteButton, this.confirm);
    this.actions = actions;
    this.message = element("div", "agentruns-runpage-message");
    this.message.hidden = true;
    head.append(this.titleNode, this.where, actions, this.message);

    this.inputNode = element("pre", "agentruns-runpage-input");
    this.chain = element("ol", "agentruns-runpage-chain");
    // The run it was forked from and the runs forked from it, each with Compare.
    this.family = element("ol", "agentruns-runpage-family");
    this.viewNode = element("div", "agentruns-runpage-view");
    this.timeline = element("ol", "agentruns-runpage-timeline");
    this.timelineNote = element("div", "agentruns-runpage-timeline-note");
    this.timelineNote.hidden = true;
    // A silent agent's last words on stderr (an ACP agent's process), as text.
    this.stderrNode = element("pre", "agentruns-runpage-stderr");
    this.stderrSection = element("section", "agentruns-runpage-section agentruns-runpage-stderr-section");
    this.stderrSection.append(element("h3", "agentruns-runpage-heading", "The agent's last words on stderr"), this.stderrNode);
    this.stderrSection.hidden = true;
    /** @type {any} */
    this.stderrTimer = null;
    this.moreButton = button("Load more events", "agentruns-runpage-more");
    this.moreButton.hidden = true;
    this.moreButton.addEventListener("click", () => void this.readEvents());
    this.node.append(
      head,
      this._section("Input", this.inputNode),
      this._section("Run", this.viewNode),
      this.stderrSection,
      this._section("Attempts", this.chain),
      this._section("Forks", this.family),
      this._section("Timeline", this.timelineNote, this.timeline, this.moreButton),
    );

    this.view = new RunView(
      pageHost(() => this.runId, () => this.baseUrl, {
        ranAgain: (run) => {
          if (this.openRun && run && typeof run.run_id === "string") this.openRun(run.run_id);
          void this.readChain();
        },
        shown: (state) => this._shown(state),
      }),
      this.viewNode,
    );
  }

  /**
   * @param {string} name
   * @param {...HTMLElement} children
   */
  _section(name, ...children) {
    const section = element("section", `agentruns-runpage-section agentruns-runpage-${name.toLowerCase()}-section`);
    section.append(element("h3", "agentruns-runpage-heading", name), ...children);
    return section;
  }

  /** Read the run and start following it. */
  async load() {
    this.view.attach(this.runId);
    let response;
    try {
      response = await apiFetch(runsUrl(this.baseUrl, this.runId));
    } catch {
      return this._say("Cannot reach the server.");
    }
    if (!response.ok) {
      this.node.dataset.problem = String(response.status);
      return this._say(await errorMessage(response));
    }
    this._setRun(await response.json());
    this.stderrTimer = setInterval(() => void this.readStderr(), STDERR_CHECK_MS);
    await Promise.all([this.readEvents(), this.readChain(), this.readFamily(), this.readStderr()]);
  }

  dispose() {
    this.disposed = true;
    if (this.stderrTimer !== null) clearInterval(this.stderrTimer);
    this.view.dispose();
  }

  /**
   * While the run's agent is silent, show the last lines its process wrote
   * to stderr (a model server's refusal often shows there first); else hide them.
   * @returns {Promise<void>}
   */
  async readStderr() {
    const state = this.view.state;
    if (this.disposed || state === null || silenceWords(state, Date.now()) === "") {
      this.stderrSection.hidden = true;
      return;
    }
    let answer;
    try {
      const response = await apiFetch(`${runsUrl(this.baseUrl, this.runId)}/stderr`);
      if (!response.ok) return;
      answer = await response.json();
    } catch {
      return;
    }
    const lines = isPlainObject(answer) && Array.isArray(answer.lines) ? answer.lines.filter((line) => typeof line === "string") : [];
    if (this.disposed || lines.length === 0) {
      this.stderrSection.hidden = true;
      return;
    }
    // Text, never markup: what an agent printed is shown as it is.
    this.stderrNode.textContent = lines.join("\n");
    this.stderrSection.hidden = false;
    // The newest line, most often the one that says why, in sight.
    this.stderrNode.scrollTop = this.stderrNode.scrollHeight;
  }

  /** @param {any} run */
  _setRun(run) {
    this.run = run;
    this.titleNode.textContent = runTitle(run) || this.runId;
    const { path, cellId } = runCell(run);
    const parts = [run.agent, path || "no notebook", createdWords(run.created_at)].filter(Boolean);
    this.where.textContent = parts.join(" · ");
    this.cellButton.disabled = path === null || this.openCell === null;
    this.cellButton.title = path === null
      ? "This run was not started from a notebook under this server's root"
      : cellId === null ? `Open ${path}` : `Open ${path} at the cell that started this run`;
    this.inputNode.textContent = JSON.stringify(run.input, null, 2);
  }

  /**
   * The run view drew a new state: read the events it has that the timeline has not.
   * @param {import("./runstate.js").RunState} state
   */
  _shown(state) {
    this.node.dataset.status = state.status;
    if (this.wantedEdit !== null) this._revealEdit();
    if (this.complete && state.lastSeq > this.cursor) {
      this.complete = false;
      void this.readEvents();
    }
  }

  /**
   * Bring the run's notebook edits into view, at the card of `editId` if it has one:
   * now if they are drawn, else as soon as the run's view draws them.
   * @param {string} editId an edit's id, or "" for the edits' section
   */
  showEdit(editId) {
    this.wantedEdit = editId;
    this._revealEdit();
  }

  _revealEdit() {
    const section = this.view.edits.node;
    if (this.wantedEdit === null || section.hidden || !section.isConnected) return;
    const card = Array.from(section.querySelectorAll(".agentruns-edit")).find((node) => /** @type {HTMLElement} */ (node).dataset.editId === this.wantedEdit);
    const target = /** @type {HTMLElement} */ (card ?? section);
    for (const node of section.querySelectorAll(".agentruns-edit--shown")) node.classList.remove("agentruns-edit--shown");
    if (card) card.classList.add("agentruns-edit--shown");
    this.wantedEdit = null;
    target.scrollIntoView?.({ block: "start" });
  }

  /**
   * The next page of events (the events endpoint's JSON answer, `limit` at a time).
   * @returns {Promise<void>}
   */
  readEvents() {
    if (this.reading === null) {
      this.reading = this._readPage().finally(() => {
        this.reading = null;
      });
    }
    return this.reading;
  }

  async _readPage() {
    const url = `${runsUrl(this.baseUrl, this.runId)}/events?after=${this.cursor}&limit=${this.pageSize}`;
    let body;
    try {
      const response = await apiFetch(url);
      if (!response.ok) return this._sayTimeline(`Cannot read the events: ${await errorMessage(response)}`);
      body = await response.json();
    } catch {
      return this._sayTimeline("Cannot reach the server.");
    }
    if (this.disposed) return;
    if (isPlainObject(body.snapshot)) {
      // The events up to the snapshot were compacted: the timeline starts after them.
      this._sayTimeline(`Events up to #${body.snapshot.last_seq} were compacted (event retention); the timeline starts after them.`);
      this.cursor = Math.max(this.cursor, Number(body.snapshot.last_seq) || 0);
    }
    const events = Array.isArray(body.events) ? body.events : [];
    const from = this.cursor;
    timelineEntries(events, this.entries, this.memory);
    if (events.length > 0) this.cursor = events[events.length - 1].seq;
    // New entries, and earlier ones that folded in this page's events (a text still streaming).
    for (const entry of this.entries) {
      if (entry.last <= from) continue;
      const node = this._renderEntry(entry);
      if (!node.isConnected) this.timeline.append(node);
    }
    const ended = events.some((/** @type {Envelope} */ event) => isTerminalType(event.type));
    this.complete = ended || body.done === true || this.cursor >= (Number(body.last_seq) || 0);
    this.moreButton.hidden = this.complete;
    this.node.dataset.timelineSeq = String(this.cursor);
  }

  /**
   * @param {Entry} entry
   * @returns {HTMLElement}
   */
  _renderEntry(entry) {
    let node = /** @type {HTMLElement | null} */ (this.timeline.querySelector(`[data-seq="${entry.seq}"]`));
    if (node === null) {
      node = element("li", "agentruns-runpage-event");
      node.dataset.seq = String(entry.seq);
      node.dataset.type = entry.type;
      node.append(element("span", "agentruns-runpage-event-at"), element("span", "agentruns-runpage-event-text"));
    }
    const start = parseTime(this.run ? this.run.created_at : null);
    /** @type {HTMLElement} */ (node.firstChild).textContent = offsetWords(entry.ts, start);
    /** @type {HTMLElement} */ (node.firstChild).title = entry.ts;
    // A question's multi-kilobyte title, a choice's long name: cut, the whole on hover.
    const text = /** @type {HTMLElement} */ (node.lastChild);
    text.textContent = cutText(entry.text, TITLE_CHARS);
    if (text.textContent !== entry.text) text.title = entry.text;
    else text.removeAttribute("title");
    return node;
  }

  /** The runs this one retried (back to the first) and the runs that retried it. */
  async readChain() {
    if (this.run === null) return;
    /** @type {any[]} */
    const back = [];
    let previous = this.run.retry_of;
    while (typeof previous === "string" && previous && back.length < MAX_CHAIN) {
      const response = await apiFetch(runsUrl(this.baseUrl, previous)).catch(() => null);
      if (response === null || !response.ok) {
        back.unshift({ run_id: previous, gone: true });
        break;
      }
      const run = await response.json();
      back.unshift(run);
      previous = run.retry_of;
    }
    /** @type {any[]} */
    let after = [];
    const response = await apiFetch(`${runsUrl(this.baseUrl)}?retry_of=${encodeURIComponent(this.runId)}&limit=20`).catch(() => null);
    if (response !== null && response.ok) {
      const body = await response.json();
      after = Array.isArray(body.runs) ? body.runs.slice().reverse() : [];
    }
    if (this.disposed) return;
    const items = [...back, this.run, ...after].map((run) => this._chainItem(run, back.length));
    this.chain.replaceChildren(...items);
    this.chain.parentElement?.toggleAttribute("hidden", back.length === 0 && after.length === 0);
  }

  /** The run this one was forked from, and the runs forked from it (oldest first). */
  async readFamily() {
    if (this.run === null) return;
    const from = isPlainObject(this.run.forked_from) ? this.run.forked_from : null;
    /** @type {any[]} */
    let forks = [];
    const url = `${runsUrl(this.baseUrl)}?forked_from=${encodeURIComponent(this.runId)}&limit=${MAX_FORKS}`;
    const response = await apiFetch(url).catch(() => null);
    if (response !== null && response.ok) {
      const body = await response.json();
      forks = Array.isArray(body.runs) ? body.runs.slice().reverse() : [];
    }
    if (this.disposed) return;
    const items = [];
    if (from !== null) {
      items.push(this._familyItem(String(from.run_id), `this run was forked from it after event ${from.seq}`, [String(from.run_id), this.runId]));
    }
    for (const fork of forks) {
      const seq = isPlainObject(fork.forked_from) ? fork.forked_from.seq : "?";
      items.push(this._familyItem(fork.run_id, `${fork.status} · ${runTitle(fork)} · forked after event ${seq}`, [this.runId, fork.run_id]));
    }
    this.family.replaceChildren(...items);
    this.family.parentElement?.toggleAttribute("hidden", items.length === 0);
  }

  /**
   * One run of the family: its id (opening its page), what it is to this run, and Compare.
   * @param {string} runId
   * @param {string} words
   * @param {[string, string]} pair the two runs Compare shows, the earlier first
   */
  _familyItem(runId, words, pair) {
    const item = element("li", "agentruns-runpage-relative");
    item.dataset.runId = runId;
    if (this.openRun === null) {
      item.append(element("span", "agentruns-runpage-relative-id", runId));
    } else {
      const link = element("a", "agentruns-runpage-attempt-link agentruns-runpage-relative-id", runId);
      link.setAttribute("href", "#");
      link.addEventListener("click", (event) => {
        event.preventDefault();
        if (this.openRun) this.openRun(runId);
      });
      item.append(link);
    }
    const compare = button("Compare", "agentruns-runpage-compare");
    compare.title = "This run and that one, side by side";
    compare.addEventListener("click", () => requestCompare(pair[0], pair[1]));
    item.append(element("span", "agentruns-runpage-relative-words", ` ${words} `), compare);
    return item;
  }

  /**
   * @param {any} run
   * @param {number} _index
   */
  _chainItem(run, _index) {
    const item = element("li", "agentruns-runpage-attempt");
    item.dataset.runId = run.run_id;
    const here = run.run_id === this.runId;
    const label = run.gone ? `${run.run_id} (deleted)` : `${run.status} · ${runTitle(run)} · ${run.run_id}`;
    if (here || run.gone || this.openRun === null) {
      item.append(element("span", here ? "agentruns-runpage-attempt-here" : "", here ? `${label} (this run)` : label));
    } else {
      const link = element("a", "agentruns-runpage-attempt-link", label);
      link.setAttribute("href", "#");
      link.addEventListener("click", (event) => {
        event.preventDefault();
        if (this.openRun) this.openRun(run.run_id);
      });
      item.append(link);
    }
    return item;
  }

  /** Open the run's notebook at the cell that started it. */
  async goToCell() {
    if (this.run === null || this.openCell === null) return;
    const { path, cellId } = runCell(this.run);
    if (path === null) return;
    try {
      await this.openCell(path, cellId);
    } catch (error) {
      this._say(`Cannot open ${path}: ${error instanceof Error ? error.message : String(error)}`);
    }
  }

  _askDelete() {
    this.deleteButton.hidden = true;
    this.confirm.hidden = false;
  }

  /** Delete the run (after the person confirmed): the API answers 409 while it is not over. */
  async delete() {
    this.confirm.hidden = true;
    this.deleteButton.hidden = false;
    let response;
    try {
      response = await apiFetch(runsUrl(this.baseUrl, this.runId), { method: "DELETE" });
    } catch {
      return this._say("Cannot reach the server.");
    }
    if (!response.ok) return this._say(`Delete failed: ${await errorMessage(response)}`);
    this.node.dataset.deleted = "true";
    this.view.dispose();
    // A run that is no more offers nothing to do: no Delete, Go to cell, Cancel or Run again.
    this.actions.hidden = true;
    this.viewNode.parentElement?.toggleAttribute("hidden", true);
    this.titleNode.textContent = `${this.titleNode.textContent} (deleted)`;
    this._say("This run was deleted: its events and its answer are gone from the server.");
    document.dispatchEvent(new CustomEvent(RUN_DELETED_EVENT, { detail: { runId: this.runId } }));
  }

  /** @param {string | null} text */
  _say(text) {
    this.message.hidden = text === null;
    this.message.textContent = text || "";
  }

  /** @param {string} text */
  _sayTimeline(text) {
    this.timelineNote.hidden = false;
    this.timelineNote.textContent = text;
  }
}

/**
 * When a run was created, as a person reads it: "created 14:05" today,
 * "created 2 Dec 2026, 14:05" another day.
 * @param {string | null | undefined} createdAt
 * @returns {string}
 */
function createdWords(createdAt) {
  const ms = parseTime(createdAt || null);
  if (ms === null) return "";
  const day = new Date(ms);
  if (day.toDateString() === new Date().toDateString()) return `created ${clockTime(ms)}`;
  const date = day.toLocaleDateString([], { day: "numeric", month: "short", year: "numeric" });
  return `created ${date}, ${clockTime(ms)}`;
}
