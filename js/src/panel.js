// The runs panel: the caller's runs, newest first, live, and what can be done with each.
//
// Plain DOM, no JupyterLab import: the labextension puts it in the left
// sidebar (labextension.js), the tests drive it in jsdom. Active runs follow
// the page's one stream (the hub the widgets share); a poll of the first page
// finds runs started elsewhere (another tab, the command line, a kernel).

import { RunActions } from "./actions.js";
import { requestCompare } from "./compare.js";
import { ConversationList } from "./conversations.js";
import { apiFetch, errorMessage, runsUrl, withSlash } from "./api.js";
import { editsSummary, runEdits } from "./edits.js";
import { NewRunForm } from "./newrun.js";
import { getStreamHub } from "./streamhub.js";
import { openInputs } from "./reducer.js";
import { RunState } from "./runstate.js";
import { RUN_DELETED_EVENT, runPagesOpen } from "./links.js";
import { ScheduleList } from "./schedules.js";
import { STATUSES } from "./status.js";
import { button, element, formatAgo, formatCost, formatTokens, inputCard, isCost, isTokenCount, parseTime } from "./dom.js";
import { silenceWords } from "./silence.js";
import { runTitle, timingWords } from "./words.js";

/** What the panel says before there is any run. */
export const NO_RUNS = "No runs yet. Start one with New run, or from a notebook's cell: %%agent demo, then the prompt.";
/** Runs on one page of the panel; "More" adds another page. */
export const PAGE_SIZE = 20;
/** The most runs the panel lists at once (the API's own limit). */
export const MAX_SHOWN = 500;
/** How often the first page is read again while the panel is visible. */
export const REFRESH_MS = 5000;
/** How often ages and running durations move on. */
export const TICK_MS = 1000;
/** How long the search waits for the typing to pause before it asks the server. */
export const SEARCH_DELAY_MS = 250;
/** The orders the list can be sorted in: the server's (newest first), or by a run's status or title. */
export const SORTS = Object.freeze(["newest", "oldest", "status", "title"]);

/**
 * @typedef {import("./runstate.js").Run} Run
 * @typedef {import("./streamhub.js").StreamHub} StreamHub
 * @typedef {{
 *   baseUrl: string,
 *   openPath?: (path: string) => void,
 *   openRun?: (runId: string, edit?: string | null) => void,
 *   openTable?: () => void,
 *   openConversation?: (conversation: import("./conversations.js").Conversation) => void,
 *   layout?: "sidebar" | "table",
 *   schedules?: boolean,
 *   serverRoot?: string | null,
 *   hub?: StreamHub,
 *   now?: () => number,
 *   setInterval?: (fn: () => void, ms: number) => any,
 *   clearInterval?: (id: any) => void,
 * }} PanelOptions
 * @typedef {{
 *   state: RunState, node: HTMLElement, chip: HTMLElement, agent: HTMLElement, title: HTMLElement, notebook: HTMLElement,
 *   age: HTMLElement, timing: HTMLElement, tokens: HTMLElement, edits: HTMLElement, inputs: HTMLElement, note: HTMLElement,
 *   cancel: HTMLButtonElement, again: HTMLButtonElement, pick: HTMLInputElement, unfollow: (() => void) | null, busy: boolean,
 *   inputsKey: string, broken: boolean, rereading: boolean,
 * }} Row
 */

/**
 * @param {string} text
 * @param {string} value
 * @returns {HTMLOptionElement}
 */
function option(text, value) {
  const node = /** @type {HTMLOptionElement} */ (element("option", "", text));
  node.value = value;
  return node;
}

/**
 * The last part of a notebook's path: what a person recognises in a narrow sidebar.
 * @param {string} path
 */
export function baseName(path) {
  const parts = path.split("/").filter(Boolean);
  return parts.length > 0 ? parts[parts.length - 1] : path;
}

/**
 * The path under the server's root of a run's session, when it names a file there.
 *
 * A kernel knows its notebook by its path on disk (absolute), the file
 * browser by its path under the server's root: a session outside the root
 * (or not a path at all) opens nothing.
 * @param {string} session
 * @param {string | null} serverRoot
 * @returns {string | null}
 */
export function contentsPath(session, serverRoot) {
  if (!session.startsWith("/")) return /^[a-z]+:/i.test(session) ? null : session;
  if (!serverRoot) return null;
  const root = serverRoot.endsWith("/") ? serverRoot : `${serverRoot}/`;
  return session.startsWith(root) ? session.slice(root.length) : null;
}

/**
 * "1,234 tokens · cost 0.02", or "" before the agent reported any.
 * @param {any} usage
 * @returns {string}
 */
export function describeTokens(usage) {
  if (usage === null || typeof usage !== "object") return "";
  const counts = [usage.input_tokens, usage.output_tokens];
  const total = counts.every(isTokenCount) ? counts[0] + counts[1] : null;
  let text = `${usage.estimated ? "≈ " : ""}${formatTokens(total, true)} tokens`;
  if (isCost(usage.cost)) text += ` · cost ${formatCost(usage.cost)}`;
  return text;
}

export class RunsPanel {
  /** @param {PanelOptions} options */
  constructor(options) {
    this.baseUrl = withSlash(options.baseUrl);
    this.openPath = options.openPath || null;
    this.openRun = options.openRun || null;
    this.layout = options.layout || "sidebar";
    this.serverRoot = options.serverRoot || null;
    this.hub = options.hub || getStreamHub({ baseUrl: this.baseUrl });
    this.actions = new RunActions({ baseUrl: this.baseUrl });
    this.now = options.now || Date.now;
    this.setInterval = options.setInterval || ((/** @type {() => void} */ fn, /** @type {number} */ ms) => globalThis.setInterval(fn, ms));
    this.clearInterval = options.clearInterval || ((/** @type {any} */ id) => globalThis.clearInterval(id));
    /** @type {Map<string, Row>} */
    this.rows = new Map();
    /** The runs listed, newest first. */
    /** @type {string[]} */
    this.order = [];
    /** @type {string | null} */
    this.next = null;
    /** @type {Set<string>} */
    this.sessions = new Set();
    this.loading = false;
    this.visible = false;
    /** @type {any} */
    this.refreshTimer = null;
    /** @type {any} */
    this.tickTimer = null;
    // Bumped when the filters change (and at dispose): an answer for the old ones is dropped.
    this.generation = 0;
    // The listing under way: one at a time, so a slow server is not asked
    // again before it answered, and a refresh never undoes a page More added.
    /** @type {Promise<void> | null} */
    this.pending = null;
    this.disposed = false;
    /** @type {Set<string>} runs shown on request (showRuns), marked until the next request */
    this.marked = new Set();

    this.node = element("div", `agentruns-panel agentruns-panel--${this.layout}`);
    const header = element("div", "agentruns-panel-header");
    header.append(element("span", "agentruns-panel-title", "Agent runs"));
    // New run: a run not tied to a cell, opened on its page where there are run pages.
    this.newRun = new NewRunForm({
      baseUrl: this.baseUrl,
      actions: this.actions,
      openRun: (runId) => {
        void this.refresh();
        if (this.openRun !== null && runPagesOpen()) this.openRun(runId);
      },
    });
    this.newRunButton = button("New run", "agentruns-panel-new");
    this.newRunButton.title = "Start a run of an agent with a prompt (not from a cell)";
    this.newRunButton.addEventListener("click", () => this.newRun.toggle());
    this.refreshButton = button("Refresh", "agentruns-panel-refresh");
    this.refreshButton.addEventListener("click", () => void this._refreshShown());
    // The conversations, as chats: beside the runs, where something opens them.
    /** @type {ConversationList | null} */
    this.conversations = null;
    /** @type {HTMLButtonElement | null} */
    this.conversationsButton = null;
    this.showingConversations = false;
    if (options.openConversation) {
      this.conversations = new ConversationList({ baseUrl: this.baseUrl, open: options.openConversation, now: this.now });
      this.conversations.node.hidden = true;
      this.conversationsButton = button("Conversations", "agentruns-panel-conversations-toggle");
      this.conversationsButton.title = "List the conversations (a notebook's runs of one agent) instead of the runs";
      this.conversationsButton.setAttribute("aria-pressed", "false");
      this.conversationsButton.addEventListener("click", () => this.showConversations(!this.showingConversations));
    }
    // Two runs ticked: Compare (beside New run) opens them side by side (where run pages open).
    /** @type {string[]} the ticked runs, oldest tick first (at most two) */
    this.comparing = [];
    this.compareButton = button("Compare", "agentruns-panel-compare");
    this.compareButton.title = "Open the two ticked runs side by side";
    this.compareButton.hidden = true;
    this.compareButton.addEventListener("click", () => {
      if (this.comparing.length === 2) requestCompare(this.comparing[0], this.comparing[1]);
    });
    header.append(element("span", "agentruns-spacer"), this.refreshButton);
    /** @type {HTMLButtonElement | null} */
    this.tableButton = null;
    if (options.openTable) {
      const open = options.openTable;
      this.tableButton = button("Table", "agentruns-panel-open-table");
      this.tableButton.title = "Open the runs as a table in the main area";
      this.tableButton.addEventListener("click", () => open());
      header.append(this.tableButton);
    }

    const filters = element("div", "agentruns-panel-filters");
    this.statusFilter = /** @type {HTMLSelectElement} */ (element("select", "agentruns-filter-status"));
    this.statusFilter.title = "Show runs with this status";
    this.statusFilter.append(option("all statuses", ""));
    for (const status of STATUSES) this.statusFilter.append(option(status, status));
    this.sessionFilter = /** @type {HTMLSelectElement} */ (element("select", "agentruns-filter-session"));
    this.sessionFilter.title = "Show runs of this notebook";
    this.sessionFilter.append(option("all notebooks", ""));
    for (const select of [this.statusFilter, this.sessionFilter]) {
      select.addEventListener("change", () => void this.reload());
    }
    this.sortSelect = /** @type {HTMLSelectElement} */ (element("select", "agentruns-panel-sort"));
    this.sortSelect.title = "Order of the runs listed";
    this.sortSelect.append(option("newest first", "newest"), option("oldest first", "oldest"), option("by status", "status"), option("by title", "title"));
    this.sortSelect.addEventListener("change", () => this._renderList());
    filters.append(this.statusFilter, this.sessionFilter, this.sortSelect);
    // The search asks the server (title, agent, notebook), so it finds runs not listed yet.
    this.search = /** @type {HTMLInputElement} */ (element("input", "agentruns-panel-search"));
    this.search.type = "search";
    this.search.placeholder = "Search title, agent, notebook";
    this.search.title = "Show runs whose title, agent or notebook contains this text";
    /** @type {any} */
    this.searchTimer = null;
    this.search.addEventListener("input", () => {
      if (this.searchTimer !== null) clearTimeout(this.searchTimer);
      this.searchTimer = setTimeout(() => {
        this.searchTimer = null;
        void this.reload();
      }, SEARCH_DELAY_MS);
    });
    this.onDeleted = (/** @type {Event} */ event) => {
      const runId = /** @type {CustomEvent} */ (event).detail?.runId;
      if (typeof runId !== "string") return;
      this._remove(runId);
      this.order = this.order.filter((id) => id !== runId);
      this._renderList();
    };
    if (typeof document !== "undefined") document.addEventListener(RUN_DELETED_EVENT, this.onDeleted);

    this.message = element("div", "agentruns-panel-message");
    this.message.hidden = true;
    this.list = element("div", "agentruns-panel-list");
    this.empty = element("div", "agentruns-panel-empty", NO_RUNS);
    this.empty.hidden = true;
    this.moreButton = button("More", "agentruns-panel-more");
    this.moreButton.hidden = true;
    this.moreButton.addEventListener("click", () => void this.more());
    // Column names, shown by the table layout only.
    const head = element("div", "agentruns-panel-table-head");
    for (const name of ["status", "agent", "title", "notebook", "created", "time", "tokens"]) head.append(element("span", "", name));
    // The caller's schedules, each with its next time and last runs (hidden while there is none).
    const openRun = this.openRun;
    /** @type {ScheduleList | null} */
    this.schedules = options.schedules
      ? new ScheduleList({ baseUrl: this.baseUrl, openRun: openRun === null ? null : (runId) => void (runPagesOpen() && openRun(runId)), now: this.now })
      : null;
    const starting = element("div", "agentruns-panel-start");
    starting.append(this.newRunButton);
    if (this.conversationsButton !== null) starting.append(this.conversationsButton);
    starting.append(this.compareButton);
    this.node.append(header, starting, this.newRun.node);
    if (this.schedules !== null) this.node.append(this.schedules.node);
    this.node.append(this.search, filters, this.message, this.empty, head, this.list, this.moreButton);
    /** The parts of the runs' list, hidden while the conversations are shown. */
    this.runsParts = [this.search, filters, head, this.list];
    if (this.conversations !== null) this.node.append(this.conversations.node);
  }

  /**
   * Show the conversations (true) or the runs (false) in the panel.
   * @param {boolean} on
   */
  showConversations(on) {
    if (this.conversations === null) return;
    this.showingConversations = on;
    for (const part of this.runsParts) part.classList.toggle("agentruns-panel-away", on);
    for (const part of [this.message, this.empty, this.moreButton]) part.classList.toggle("agentruns-panel-away", on);
    this.conversations.node.hidden = !on;
    if (this.conversationsButton !== null) {
      this.conversationsButton.setAttribute("aria-pressed", String(on));
      this.conversationsButton.textContent = on ? "Runs" : "Conversations";
      this.conversationsButton.title = on ? "List the runs again" : "List the conversations (a notebook's runs of one agent) instead of the runs";
    }
    void this._refreshShown();
  }

  /** Read again what the panel shows: the runs, or the conversations. */
  _refreshShown() {
    if (this.schedules !== null) void this.schedules.load();
    if (this.showingConversations && this.conversations !== null) return this.conversations.load();
    return this.refresh();
  }

  /** The panel is on screen: read the runs now, then keep them fresh. */
  show() {
    if (this.visible) return;
    this.visible = true;
    // Only where run pages (and the table) exist: JupyterLab, not Notebook 7.
    if (this.tableButton !== null) this.tableButton.hidden = !runPagesOpen();
    if (this.conversationsButton !== null) this.conversationsButton.hidden = !runPagesOpen();
    if (this.schedules !== null) void this.schedules.load();
    void this.refresh();
    // A browser tab in the background asks nothing: the next look after it comes back does.
    this.refreshTimer = this.setInterval(() => {
      if (!document.hidden) void this._refreshShown();
    }, REFRESH_MS);
    this.tickTimer = this.setInterval(() => this._tick(), TICK_MS);
  }

  /** Hidden: no polling. Live runs keep following, so their rows are right when it comes back. */
  hide() {
    this.visible = false;
    for (const timer of [this.refreshTimer, this.tickTimer]) if (timer !== null) this.clearInterval(timer);
    this.refreshTimer = this.tickTimer = null;
  }

  dispose() {
    this.disposed = true;
    this.generation += 1;
    this.hide();
    if (this.searchTimer !== null) clearTimeout(this.searchTimer);
    if (typeof document !== "undefined") document.removeEventListener(RUN_DELETED_EVENT, this.onDeleted);
    for (const row of this.rows.values()) this._unfollow(row);
    this.rows.clear();
  }

  /**
   * List a notebook's runs and mark `runIds` among them: runs whose cells
   * are not in the saved notebook, which the notebook cannot show.
   * @param {string | null} session
   * @param {string[]} runIds
   */
  async showRuns(session, runIds) {
    this.marked = new Set(runIds);
    if (session !== null) {
      this.sessions.add(session);
      this._renderSessions();
    }
    this.statusFilter.value = "";
    this.search.value = "";
    this.sessionFilter.value = session ?? "";
    await this.reload();
    const first = runIds.map((id) => this.rows.get(id)).find((row) => row !== undefined);
    if (first && typeof first.node.scrollIntoView === "function") first.node.scrollIntoView({ block: "nearest" });
  }

  /** Start over with the filters' values: the first page. */
  async reload() {
    this.generation += 1;
    this.pending = null;
    for (const row of this.rows.values()) this._unfollow(row);
    this.rows.clear();
    this.order = [];
    this.list.replaceChildren();
    this.next = null;
    await this.refresh();
  }

  /**
   * Read the listed runs again (as many as are shown, at least a page) and
   * merge them in; while a listing is under way, that one is the answer.
   * @returns {Promise<void>}
   */
  refresh() {
    if (this.pending === null) {
      const limit = Math.min(MAX_SHOWN, Math.max(PAGE_SIZE, this.order.length));
      this._start(this._list({ limit }, this.generation), true);
    }
    return /** @type {Promise<void>} */ (this.pending);
  }

  /** The next page, after the oldest run shown (once the listing under way is done). */
  async more() {
    while (this.pending !== null) await this.pending;
    if (this.next === null) return;
    await this._start(this._list({ limit: PAGE_SIZE, before: this.next }, this.generation), false);
  }

  /**
   * @param {Promise<{runs: Run[], next: string | null} | null>} listing
   * @param {boolean} head
   */
  _start(listing, head) {
    const pending = listing
      .then((answer) => {
        if (answer === null) return;
        this._merge(answer.runs, head);
        this.next = answer.next;
        this._renderList();
      })
      .finally(() => {
        if (this.pending === pending) this.pending = null;
      });
    this.pending = pending;
    return pending;
  }

  /**
   * @param {Record<string, string | number>} params
   * @param {number} generation
   * @returns {Promise<{runs: Run[], next: string | null} | null>}
   */
  async _list(params, generation) {
    const query = new URLSearchParams();
    for (const [name, value] of Object.entries(params)) query.set(name, String(value));
    if (this.statusFilter.value) query.set("status", this.statusFilter.value);
    if (this.sessionFilter.value) query.set("session", this.sessionFilter.value);
    const search = this.search.value.trim();
    if (search) query.set("q", search);
    this.loading = true;
    this.node.dataset.loading = "true";
    try {
      const response = await apiFetch(`${runsUrl(this.baseUrl)}?${query}`);
      if (generation !== this.generation) return null;
      if (!response.ok) {
        this._say(`Cannot list runs: ${await errorMessage(response)}`);
        return null;
      }
      const body = await response.json();
      this._say(null);
      return { runs: Array.isArray(body.runs) ? body.runs : [], next: typeof body.next === "string" ? body.next : null };
    } catch {
      if (generation === this.generation) this._say("Cannot reach the server; trying again shortly.");
      return null;
    } finally {
      this.loading = false;
      delete this.node.dataset.loading;
    }
  }

  /**
   * Rows for new runs, fresh state for the others; a first page replaces the head of the list.
   * @param {Run[]} runs
   * @param {boolean} head the newest runs (a refresh), not a later page
   */
  _merge(runs, head) {
    const ids = [];
    for (const run of runs) {
      if (!run || typeof run.run_id !== "string") continue;
      ids.push(run.run_id);
      if (typeof run.session === "string" && run.session) this.sessions.add(run.session);
      let row = this.rows.get(run.run_id);
      if (row === undefined) {
        row = this._row(run.run_id);
        this.rows.set(run.run_id, row);
      }
      // The stream is ahead of a listing read before its last events: keep what it brought.
      if (!row.broken && (row.state.run === null || run.last_seq >= row.state.lastSeq)) this._load(row, run);
      this._follow(row);
      this._renderRow(row);
    }
    if (head) {
      // A refresh reads as many runs as are shown: what it no longer lists
      // (deleted, or pushed past the end by newer runs) leaves the panel.
      const kept = new Set(ids);
      for (const id of this.order) if (!kept.has(id)) this._remove(id);
      this.order = ids;
    } else {
      this.order = [...this.order, ...ids.filter((id) => !this.order.includes(id))];
    }
    this._renderSessions();
  }

  /** @param {string} runId */
  _remove(runId) {
    const row = this.rows.get(runId);
    if (row === undefined) return;
    this._unfollow(row);
    row.node.remove();
    this.rows.delete(runId);
  }

  /**
   * Live events for a run that is not over yet, through the page's one stream.
   * @param {Row} row
   */
  _follow(row) {
    if (row.unfollow !== null || row.state.terminal || row.broken || !this._listed(row)) return;
    const runId = row.state.runId;
    row.unfollow = this.hub.register(runId, row.state.lastSeq, {
      onEvent: (envelope) => {
        const result = row.state.applyEnvelope(envelope);
        if (result === "gap") void this._reread(row);
        else if (result === "protocol_error") this._broken(row);
        this._renderRow(row);
        if (row.state.terminal) this._unfollow(row);
      },
      onSnapshot: (run) => {
        this._load(row, run);
        this._renderRow(row);
      },
      onError: () => this._unfollow(row),
    });
  }

  /**
   * Whether `row` is still the panel's row of its run (an answer that comes
   * back after a filter changed must not bring it back to life).
   * @param {Row} row
   */
  _listed(row) {
    return !this.disposed && this.rows.get(row.state.runId) === row;
  }

  /**
   * @param {Row} row
   * @param {unknown} run
   */
  _load(row, run) {
    if (row.state.loadRun(run) === "protocol_error") this._broken(row);
  }

  /**
   * A run the panel cannot show (an answer it refuses, e.g. a text over its
   * bound): say so on its row and stop following it, rather than read it
   * again and again.
   * @param {Row} row
   */
  _broken(row) {
    row.broken = true;
    this._unfollow(row);
    this._note(row, `This run cannot be shown here: ${row.state.problem}. Its notebook's view or the REST API can read it.`);
  }

  /** @param {Row} row */
  _unfollow(row) {
    if (row.unfollow === null) return;
    const stop = row.unfollow;
    row.unfollow = null;
    stop();
  }

  /**
   * The run as the server has it, when the stream lost track of it.
   * @param {Row} row
   */
  async _reread(row) {
    if (row.rereading) return; // the events behind the gap all ask: one read answers them
    row.rereading = true;
    try {
      const response = await apiFetch(runsUrl(this.baseUrl, row.state.runId));
      if (!response.ok || !this._listed(row)) return;
      const run = await response.json();
      this._unfollow(row);
      row.state = new RunState(row.state.runId);
      this._load(row, run);
      this._follow(row);
      this._renderRow(row);
    } catch {
      // The next refresh reads it again.
    } finally {
      row.rereading = false;
    }
  }

  /**
   * @param {string} runId
   * @returns {Row}
   */
  _row(runId) {
    const node = element("div", "agentruns-panel-run");
    node.dataset.runId = runId;
    const top = element("div", "agentruns-panel-line");
    const chip = element("span", "agentruns-chip");
    const agent = element("span", "agentruns-panel-agent");
    const notebook = element("a", "agentruns-panel-notebook");
    notebook.addEventListener("click", (event) => {
      event.preventDefault();
      const path = this._notebookPath(row);
      if (path !== null && this.openPath) this.openPath(path);
    });
    const age = element("span", "agentruns-panel-age");
    top.append(chip, agent, element("span", "agentruns-spacer"), age);
    // What the run was asked: user text, shown as text (cut with an ellipsis by the stylesheet).
    // A link to the run's own page.
    const title = element("a", "agentruns-panel-run-title");
    title.addEventListener("click", (event) => {
      event.preventDefault();
      if (this.openRun && runPagesOpen()) this.openRun(runId);
    });
    const where = element("div", "agentruns-panel-line");
    where.append(notebook);
    const second = element("div", "agentruns-panel-line agentruns-panel-detail");
    const timing = element("span", "agentruns-panel-timing");
    const tokens = element("span", "agentruns-panel-tokens");
    // How many notebook edits the run made: a link to them, with their diffs and Undo, on the run's page.
    const edits = element("a", "agentruns-panel-edits");
    edits.addEventListener("click", (event) => {
      event.preventDefault();
      if (this.openRun && runPagesOpen() && edits.hasAttribute("href")) this.openRun(runId, "");
    });
    const cancel = button("Cancel", "agentruns-cancel");
    const again = button("Run again", "agentruns-again");
    const pick = /** @type {HTMLInputElement} */ (element("input", "agentruns-panel-pick"));
    pick.type = "checkbox";
    pick.title = "Tick two runs to compare them";
    pick.setAttribute("aria-label", "Compare this run");
    pick.addEventListener("change", () => this._pick(runId, pick.checked));
    second.append(timing, tokens, edits, element("span", "agentruns-spacer"), cancel, again, pick);
    const inputs = element("div", "agentruns-panel-inputs");
    const note = element("div", "agentruns-panel-note");
    note.hidden = true;
    const id = element("div", "agentruns-panel-id", runId);
    id.addEventListener("click", () => {
      if (this.openRun && runPagesOpen()) this.openRun(runId);
    });
    node.append(top, title, where, second, inputs, note, id);
    /** @type {Row} */
    const row = {
      state: new RunState(runId), node, chip, agent, title, notebook, age, timing, tokens, edits, inputs, note, cancel, again, pick,
      unfollow: null, busy: false, inputsKey: "", broken: false, rereading: false,
    };
    cancel.addEventListener("click", () => void this._cancel(row));
    again.addEventListener("click", () => void this._runAgain(row));
    return row;
  }

  /**
   * A run ticked (or not) for Compare: a third tick unticks the oldest.
   * @param {string} runId
   * @param {boolean} ticked
   */
  _pick(runId, ticked) {
    this.comparing = this.comparing.filter((id) => id !== runId);
    if (ticked) this.comparing.push(runId);
    while (this.comparing.length > 2) {
      const dropped = /** @type {string} */ (this.comparing.shift());
      const row = this.rows.get(dropped);
      if (row) row.pick.checked = false;
    }
    this.compareButton.hidden = this.comparing.length !== 2 || !runPagesOpen();
  }

  /** @param {Row} row */
  _renderRow(row) {
    const { state } = row;
    const run = state.run;
    row.node.dataset.status = state.status;
    const marked = this.marked.has(state.runId);
    row.node.classList.toggle("agentruns-panel-run--marked", marked);
    if (marked && row.note.hidden) this._note(row, "Its cell is not in the saved notebook.");
    row.chip.dataset.kind = state.status;
    row.chip.textContent = state.attempt > 1 && !state.terminal ? `${state.status} (attempt ${state.attempt})` : state.status;
    row.agent.textContent = run ? run.agent : "";
    row.title.textContent = run ? runTitle(run) : "";
    const pages = this.openRun !== null && runPagesOpen();
    row.title.title = pages ? `${row.title.textContent}: open this run's page` : row.title.textContent;
    if (pages) row.title.setAttribute("href", "#");
    else row.title.removeAttribute("href");
    const session = run && typeof run.session === "string" ? run.session : "";
    row.notebook.textContent = session ? baseName(session) : "no notebook";
    const path = this._notebookPath(row);
    const openable = path !== null && this.openPath !== null;
    row.notebook.title = !session
      ? "This run was not started from a notebook"
      : openable
        ? `Open ${path}`
        : `${session} (not a file under this server's root)`;
    row.notebook.classList.toggle("agentruns-panel-notebook--none", !openable);
    if (openable) row.notebook.setAttribute("href", "#");
    else row.notebook.removeAttribute("href");
    row.tokens.textContent = describeTokens(state.snapshot.usage);
    row.edits.textContent = editsSummary(runEdits(state.snapshot));
    if (pages && row.edits.textContent) {
      row.edits.setAttribute("href", "#");
      row.edits.title = "See these edits, with their diffs and Undo, on the run's page";
    } else {
      row.edits.removeAttribute("href");
      row.edits.removeAttribute("title");
    }
    this._renderTimes(row);
    row.cancel.hidden = state.terminal || state.status === "cancelling";
    row.again.hidden = !state.terminal;
    row.cancel.disabled = row.again.disabled = row.busy;
    row.pick.hidden = !pages;
    row.pick.checked = this.comparing.includes(state.runId);
    this._renderInputs(row);
  }

  /**
   * @param {Row} row
   * @returns {string | null}
   */
  _notebookPath(row) {
    const session = row.state.run ? row.state.run.session : null;
    return typeof session === "string" && session ? contentsPath(session, this.serverRoot) : null;
  }

  /** @param {Row} row */
  _renderTimes(row) {
    const now = this.now();
    const created = parseTime(row.state.run ? row.state.run.created_at : null);
    row.age.textContent = created === null ? "" : formatAgo(created, now);
    row.age.title = row.state.run && row.state.run.created_at ? `created ${row.state.run.created_at}` : "";
    const silence = silenceWords(row.state, now);
    row.timing.textContent = [timingWords(row.state, now), silence].filter(Boolean).join(" · ");
    row.timing.classList.toggle("agentruns-panel-timing--silent", silence !== "");
  }

  /** @param {Row} row */
  _renderInputs(row) {
    const open = openInputs(row.state.snapshot);
    const key = open.map((input) => String(input.request_id)).join(",");
    if (key === row.inputsKey) return;
    row.inputsKey = key;
    row.inputs.replaceChildren(...open.map((input) => inputCard(input, (choice, card) => void this._answer(row, input, choice, card))));
  }

  _renderList() {
    const children = this._sorted().map((row) => row.node);
    // Moving a node that is already in place would lose a half-done click on it.
    const current = Array.from(this.list.children);
    if (current.length !== children.length || current.some((node, index) => node !== children[index])) {
      this.list.replaceChildren(...children);
    }
    this.empty.hidden = this.order.length > 0 || this.loading;
    this.empty.textContent = this.statusFilter.value || this.sessionFilter.value || this.search.value.trim()
      ? "No runs match these filters."
      : NO_RUNS;
    this.moreButton.hidden = this.next === null;
  }

  /**
   * The rows listed, in the order chosen: the server's (newest first), its
   * reverse, or by status (active ones first) or title, newest first within.
   * @returns {Row[]}
   */
  _sorted() {
    const rows = /** @type {Row[]} */ (this.order.map((id) => this.rows.get(id)).filter((row) => row !== undefined));
    const sort = this.sortSelect.value;
    if (sort === "oldest") return rows.reverse();
    if (sort === "status") {
      const rank = (/** @type {Row} */ row) => STATUSES.indexOf(row.state.status);
      return rows.map((row, index) => ({ row, index })).sort((a, b) => rank(a.row) - rank(b.row) || a.index - b.index).map(({ row }) => row);
    }
    if (sort === "title") {
      const title = (/** @type {Row} */ row) => (row.state.run ? runTitle(row.state.run) : "").toLocaleLowerCase();
      return rows.map((row, index) => ({ row, index })).sort((a, b) => title(a.row).localeCompare(title(b.row)) || a.index - b.index).map(({ row }) => row);
    }
    return rows;
  }

  _renderSessions() {
    const chosen = this.sessionFilter.value;
    const known = Array.from(this.sessionFilter.options).slice(1).map((option) => option.value);
    const wanted = Array.from(this.sessions).sort();
    if (known.length === wanted.length && known.every((value, index) => value === wanted[index])) return;
    this.sessionFilter.replaceChildren(option("all notebooks", ""), ...wanted.map((session) => option(baseName(session), session)));
    this.sessionFilter.value = chosen;
  }

  _tick() {
    if (this.showingConversations && this.conversations !== null) this.conversations.render();
    for (const row of this.rows.values()) this._renderTimes(row);
  }

  /**
   * @param {Row} row
   * @param {string | null} text
   */
  _note(row, text) {
    row.note.hidden = text === null;
    row.note.textContent = text || "";
  }

  /** @param {string | null} text */
  _say(text) {
    this.message.hidden = text === null;
    this.message.textContent = text || "";
  }

  /**
   * @param {Row} row
   * @param {() => Promise<void>} action
   */
  async _act(row, action) {
    if (row.busy) return;
    row.busy = true;
    this._note(row, null);
    this._renderRow(row);
    try {
      await action();
    } catch {
      this._note(row, "Cannot reach the server.");
    } finally {
      row.busy = false;
      this._renderRow(row);
    }
  }

  /** @param {Row} row */
  _cancel(row) {
    return this._act(row, async () => {
      const { run, problem } = await this.actions.cancel(row.state.runId, "cancelled from the runs panel");
      if (problem !== null) return this._note(row, `Cancel failed: ${problem}`);
      if (!this._listed(row) || row.broken) return;
      if (run.last_seq >= row.state.lastSeq) this._load(row, run);
      this._follow(row);
    });
  }

  /** @param {Row} row */
  _runAgain(row) {
    return this._act(row, async () => {
      const old = row.state.run;
      if (old === null) return;
      const { problem } = await this.actions.runAgain(old);
      if (problem !== null) return this._note(row, `Run again failed: ${problem}`);
      // The new run is the newest: the first page has it (unless the filters leave it out).
      await this.refresh();
    });
  }

  /**
   * @param {Row} row
   * @param {any} input
   * @param {string} choice
   * @param {HTMLElement} card
   */
  _answer(row, input, choice, card) {
    return this._act(row, async () => {
      for (const node of card.querySelectorAll("button")) /** @type {HTMLButtonElement} */ (node).disabled = true;
      const { problem } = await this.actions.answer(row.state.runId, String(input.request_id), choice);
      if (problem !== null) {
        for (const node of card.querySelectorAll("button")) /** @type {HTMLButtonElement} */ (node).disabled = false;
        this._note(row, `Answer failed: ${problem}`);
      }
    });
  }
}
