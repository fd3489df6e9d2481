// What needs the person: how many runs are going and waiting, and the moments
// a run asks a question, fails, or ends.
//
// Plain DOM, no JupyterLab import: the labextension turns what this says into
// toasts, a status-bar item and a badge (notify.js), the tests drive it in
// node. It reads the caller's newest runs now and then (the API the panel
// reads) and follows the active ones through the page's one stream (the hub
// the widgets and the panel share): no connection of its own.

import { RunActions } from "./actions.js";
import { apiFetch, runsUrl, withSlash } from "./api.js";
import { TITLE_CHARS, cutText, parseTime } from "./dom.js";
import { getStreamHub } from "./streamhub.js";
import { openInputs } from "./reducer.js";
import { RunState } from "./runstate.js";
import { choiceName, formatDuration, runTitle } from "./words.js";

/** How many of the newest runs each look reads: active runs older than these are not counted. */
export const WATCH_LIMIT = 100;
/** How often the list is read while the page is visible. */
export const POLL_MS = 5000;
/** A run that ran at least this long is worth a word when it ends. */
export const LONG_RUN_MS = 60_000;

/**
 * @typedef {import("./runstate.js").Run} Run
 * @typedef {import("./streamhub.js").StreamHub} StreamHub
 * @typedef {{running: number, waiting: number}} Counts
 * @typedef {{
 *   onCounts?: (counts: Counts) => void,
 *   onQuestion?: (run: Run, input: any) => void,
 *   onResolved?: (runId: string, requestId: string) => void,
 *   onEnded?: (run: Run, state: RunState, durationMs: number | null) => void,
 * }} WatchListener
 * @typedef {{state: RunState, unfollow: (() => void) | null, open: Set<string>, rereading: boolean}} Watched
 * @typedef {{
 *   baseUrl: string,
 *   hub?: StreamHub,
 *   fetch?: (url: string, init?: any) => Promise<Response>,
 *   setInterval?: (fn: () => void, ms: number) => any,
 *   clearInterval?: (id: any) => void,
 *   hidden?: () => boolean,
 * }} WatchOptions
 */

/**
 * How long a run ran, in ms, from its start to its end (null when either is unknown).
 * @param {RunState} state
 * @returns {number | null}
 */
export function runDuration(state) {
  const started = parseTime(state.startedAt);
  const finished = parseTime(state.finishedAt);
  return started === null || finished === null ? null : Math.max(0, finished - started);
}

/**
 * The counts a status bar shows: running (queued, running, cancelling) and waiting for a person.
 * @param {Iterable<RunState>} states
 * @returns {Counts}
 */
export function countRuns(states) {
  let running = 0;
  let waiting = 0;
  for (const state of states) {
    if (state.terminal) continue;
    if (state.status === "waiting") waiting += 1;
    else running += 1;
  }
  return { running, waiting };
}

/**
 * The last part of a notebook's path, or "" for a run of no notebook.
 * @param {any} run
 */
function notebookName(run) {
  const session = run && typeof run.session === "string" ? run.session : "";
  const parts = session.split("/").filter(Boolean);
  return parts.length > 0 ? parts[parts.length - 1] : "";
}

/**
 * What a toast says of a question, the question first: "A run asks: Write the answer? (weather, analysis.ipynb)".
 * @param {any} run
 * @param {any} input
 * @returns {string}
 */
export function questionWords(run, input) {
  const where = notebookName(run);
  const title = typeof input.title === "string" && input.title ? cutText(input.title, TITLE_CHARS) : "a question";
  return `A run asks: ${title} (${runTitle(run)}${where ? `, ${where}` : ""})`;
}

/**
 * The buttons of a question's toast: `[choice, label]`, in the order offered.
 * @param {any} input
 * @returns {[string, string][]}
 */
export function questionChoices(input) {
  const choices = Array.isArray(input.choices) ? input.choices.map(String) : [];
  return choices.map((/** @type {string} */ choice) => [choice, choiceName(input, choice)]);
}

/**
 * What a toast says of a run that ended: "Run failed: … ", "Run finished after 3 min 5 s: …".
 * @param {any} run
 * @param {RunState} state
 * @param {number | null} durationMs
 * @returns {string}
 */
export function endedWords(run, state, durationMs) {
  const where = notebookName(run);
  const about = `${runTitle(run)}${where ? ` (${where})` : ""}`;
  if (state.status === "failed") {
    const message = state.error && typeof state.error.message === "string" ? state.error.message : "";
    return `Run failed: ${about}${message ? `: ${message}` : ""}`;
  }
  const after = durationMs === null ? "" : ` after ${formatDuration(durationMs)}`;
  if (state.status === "succeeded") return `Run finished${after}: ${about}`;
  return `Run ${state.status}${after}: ${about}`;
}

/**
 * The kind of toast a run that ended is worth, or null: a failure, or the end
 * of a run that ran for LONG_RUN_MS or more, each unless its setting is off
 * or the person is looking at the run's notebook.
 * @param {RunState} state
 * @param {number | null} durationMs
 * @param {{notifyFailures: boolean, notifyLongRuns: boolean}} settings
 * @param {boolean} inView
 * @returns {"error" | "success" | "info" | null}
 */
export function endedToast(state, durationMs, settings, inView) {
  if (inView) return null;
  if (state.status === "failed") return settings.notifyFailures ? "error" : null;
  if (!settings.notifyLongRuns || durationMs === null || durationMs < LONG_RUN_MS) return null;
  return state.status === "succeeded" ? "success" : "info";
}

/**
 * The status bar's words: "2 running · 1 waiting", "" when no run is active.
 * @param {Counts} counts
 * @returns {string}
 */
export function countWords(counts) {
  const parts = [];
  if (counts.running > 0) parts.push(`${counts.running} running`);
  if (counts.waiting > 0) parts.push(`${counts.waiting} waiting`);
  return parts.join(" · ");
}

export class RunWatch {
  /** @param {WatchOptions} options */
  constructor(options) {
    this.baseUrl = withSlash(options.baseUrl);
    this.hub = options.hub || getStreamHub({ baseUrl: this.baseUrl });
    this.fetch = options.fetch || null;
    this.actions = new RunActions({ baseUrl: this.baseUrl, fetch: options.fetch });
    this.setInterval = options.setInterval || ((/** @type {() => void} */ fn, /** @type {number} */ ms) => globalThis.setInterval(fn, ms));
    this.clearInterval = options.clearInterval || ((/** @type {any} */ id) => globalThis.clearInterval(id));
    this.hidden = options.hidden || (() => typeof document !== "undefined" && document.hidden);
    /** @type {Map<string, Watched>} active runs */
    this.runs = new Map();
    /** @type {Set<WatchListener>} */
    this.listeners = new Set();
    /** @type {Counts} */
    this.counts = { running: 0, waiting: 0 };
    /** @type {any} */
    this.timer = null;
    /** @type {Promise<void> | null} */
    this.pending = null;
    /** @type {{ids: Set<string>, oldest: number} | null} what the last look listed */
    this.listed = null;
    this.disposed = false;
  }

  /**
   * @param {WatchListener} listener
   * @returns {() => void} stops listening
   */
  listen(listener) {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Read the runs now, then every POLL_MS while the page is visible. */
  start() {
    if (this.timer !== null || this.disposed) return;
    void this.poll();
    this.timer = this.setInterval(() => {
      if (!this.hidden()) void this.poll();
    }, POLL_MS);
  }

  dispose() {
    this.disposed = true;
    if (this.timer !== null) this.clearInterval(this.timer);
    this.timer = null;
    for (const watched of this.runs.values()) this._unfollow(watched);
    this.runs.clear();
    this.listeners.clear();
  }

  /**
   * One look at the newest runs (while one is under way, that one is the answer).
   * @returns {Promise<void>}
   */
  poll() {
    if (this.pending === null) {
      this.pending = this._poll().finally(() => {
        this.pending = null;
      });
    }
    return this.pending;
  }

  async _poll() {
    let runs;
    try {
      const response = await this._fetch(`${runsUrl(this.baseUrl)}?limit=${WATCH_LIMIT}`);
      if (!response.ok) return;
      const body = await response.json();
      runs = Array.isArray(body.runs) ? body.runs : [];
    } catch {
      return; // the next look tries again
    }
    if (this.disposed) return;
    /** @type {Run[]} */
    const listed = runs.filter((/** @type {any} */ run) => run && typeof run.run_id === "string");
    const previous = this.listed;
    for (const run of listed) {
      // A run that started and ended between two looks is news too (a quick failure);
      // the runs the first look finds ended are not.
      const fresh = previous !== null && !previous.ids.has(run.run_id) && (parseTime(run.created_at) ?? -Infinity) >= previous.oldest;
      this._take(run, fresh);
    }
    const times = listed.map((run) => parseTime(run.created_at) ?? Infinity);
    this.listed = { ids: new Set(listed.map((run) => run.run_id)), oldest: listed.length < WATCH_LIMIT ? -Infinity : Math.min(...times) };
    this._counted();
  }

  /**
   * @param {string} url
   * @param {any} [init]
   */
  _fetch(url, init) {
    return this.fetch ? this.fetch(url, init) : apiFetch(url, init);
  }

  /**
   * A run as the list or the server has it.
   * @param {Run} run
   * @param {boolean} fresh new since the last look: told even when it has ended already
   */
  _take(run, fresh = false) {
    let watched = this.runs.get(run.run_id);
    if (watched === undefined) {
      const state = new RunState(run.run_id);
      if (state.loadRun(run) === "protocol_error" || (state.terminal && !fresh)) return;
      watched = { state, unfollow: null, open: new Set(), rereading: false };
      this.runs.set(run.run_id, watched);
      this._changed(watched);
      this._follow(watched);
    } else if (typeof run.last_seq === "number" && run.last_seq > watched.state.lastSeq) {
      if (watched.state.loadRun(run) === "protocol_error") return this._drop(watched);
      this._changed(watched);
    }
  }

  /** @param {Watched} watched */
  _follow(watched) {
    if (watched.unfollow !== null || watched.state.terminal) return;
    watched.unfollow = this.hub.register(watched.state.runId, watched.state.lastSeq, {
      onEvent: (envelope) => {
        const result = watched.state.applyEnvelope(envelope);
        if (result === "gap") void this._reread(watched);
        else if (result === "protocol_error") this._drop(watched);
        else this._changed(watched);
        this._counted();
      },
      onSnapshot: (run) => {
        if (watched.state.loadRun(run) === "protocol_error") this._drop(watched);
        else this._changed(watched);
        this._counted();
      },
      onError: () => {
        this._drop(watched);
        this._counted();
      },
    });
  }

  /** @param {Watched} watched */
  async _reread(watched) {
    if (watched.rereading) return;
    watched.rereading = true;
    try {
      const response = await this._fetch(runsUrl(this.baseUrl, watched.state.runId));
      if (!response.ok || this.runs.get(watched.state.runId) !== watched) return;
      const run = await response.json();
      this._unfollow(watched);
      if (watched.state.loadRun(run) === "protocol_error") return this._drop(watched);
      this._changed(watched);
      this._follow(watched);
      this._counted();
    } catch {
      // The next look at the list reads it again.
    } finally {
      watched.rereading = false;
    }
  }

  /**
   * Say what is new about a run: questions asked or answered, its end.
   * @param {Watched} watched
   */
  _changed(watched) {
    const { state } = watched;
    const run = /** @type {Run} */ (state.run || { run_id: state.runId });
    const open = new Map(openInputs(state.snapshot).map((input) => [String(input.request_id), input]));
    for (const requestId of watched.open) {
      if (!open.has(requestId)) {
        watched.open.delete(requestId);
        this._tell("onResolved", state.runId, requestId);
      }
    }
    for (const [requestId, input] of open) {
      if (watched.open.has(requestId)) continue;
      watched.open.add(requestId);
      this._tell("onQuestion", run, input);
    }
    if (state.terminal && this.runs.get(state.runId) === watched) {
      this.runs.delete(state.runId);
      this._unfollow(watched);
      this._tell("onEnded", run, state, runDuration(state));
    }
  }

  /** @param {Watched} watched */
  _drop(watched) {
    if (this.runs.get(watched.state.runId) === watched) this.runs.delete(watched.state.runId);
    this._unfollow(watched);
    for (const requestId of watched.open) this._tell("onResolved", watched.state.runId, requestId);
    watched.open.clear();
  }

  /** @param {Watched} watched */
  _unfollow(watched) {
    if (watched.unfollow === null) return;
    const stop = watched.unfollow;
    watched.unfollow = null;
    stop();
  }

  _counted() {
    const counts = countRuns([...this.runs.values()].map((watched) => watched.state));
    if (counts.running === this.counts.running && counts.waiting === this.counts.waiting) return;
    this.counts = counts;
    this._tell("onCounts", counts);
  }

  /**
   * @param {keyof WatchListener} method
   * @param {...any} args
   */
  _tell(method, ...args) {
    for (const listener of [...this.listeners]) {
      const handler = listener[method];
      if (typeof handler !== "function") continue;
      try {
        /** @type {Function} */ (handler).apply(listener, args);
      } catch (error) {
        console.error(`agentruns: a listener's ${method} failed`, error);
      }
    }
  }

  /**
   * Answer a run's question; null when the server took it, else what went wrong.
   * @param {string} runId
   * @param {string} requestId
   * @param {string} choice
   * @returns {Promise<string | null>}
   */
  async answer(runId, requestId, choice) {
    return (await this.actions.answer(runId, requestId, choice)).problem;
  }
}
