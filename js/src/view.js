// The view of one run, shared by the anywidget view and the labextension's renderer.
//
// It renders the run's snapshot, then follows it through the page's one
// stream hub. What it needs from around it (which run, the kernel's model if
// there is one) comes through a small RunHost adapter.

import { RunActions, UNREACHABLE } from "./actions.js";
import { apiBase, apiFetch, errorMessage, runsUrl } from "./api.js";
import { getStreamHub } from "./streamhub.js";
import {
  button, codeBlock, element, formatAgo, formatCost, formatTokens, inputCard, isCost, kindLabel, parseTime, toolContent,
} from "./dom.js";
import { EditsSection, runEdits } from "./edits.js";
import { compactJson, hasOwn, isPlainObject } from "./json.js";
import { runPagesOpen, requestRunPage } from "./links.js";
import { MAX_MARKDOWN_CHARS, renderMarkdown } from "./markdown.js";
import { RunState } from "./runstate.js";
import { requestCompare } from "./compare.js";
import { choiceWords, pageAgents } from "./pickers.js";
import { retryForm } from "./retry.js";
import { ThreadSection } from "./thread.js";
import { ACTIVE_STATUSES, isTerminal } from "./status.js";
import { silenceWords } from "./silence.js";
import { cancelledWords, clockTime, formatDuration, progressWords, runTitle, sameRunWords, timingWords } from "./words.js";

/**
 * @typedef {import("./models.js").WidgetModel} WidgetModel
 * @typedef {import("./runstate.js").Run} Run
 * @typedef {import("./reducer.js").Message} Message
 * @typedef {import("./reducer.js").Tool} Tool
 * @typedef {import("./reducer.js").Progress} Progress
 * @typedef {import("./reducer.js").Usage} Usage
 * @typedef {import("./reducer.js").Input} Input
 * @typedef {import("./reducer.js").PlanEntry} PlanEntry
 * @typedef {import("./runstate.js").UnknownEvent} UnknownEvent
 * @typedef {import("./edits.js").Edit} Edit
 */

/**
 * What a view needs from where it is shown.
 * @typedef {{
 *   runId(): string,
 *   baseUrl(): string | null,
 *   reattached(): boolean,
 *   followed(): string,
 *   savedRecord(): string | null,
 *   subscribe(callback: () => void): () => void,
 *   save(runId: string, lastSeq: number, status: string, now: boolean): void,
 *   ranAgain(run: Run, previous: string): void,
 *   shown?(state: RunState): void,
 *   threadEnded?(runIds: string[]): void,
 * }} RunHost
 * `threadEnded`: the follow-ups under the view that have ended (see ThreadHost's `ended`).
 */

/** How often `last_seq` is written back to the kernel at most, in ms. */
export const SAVE_INTERVAL_MS = 500;
/** How often a streaming message is rendered as Markdown at most, in ms. */
export const MARKDOWN_INTERVAL_MS = 100;
const LOAD_RETRY_FLOOR_MS = 1000;
const CLOCK_TICK_MS = 1000;
/** How long the header says a run was resumed (taken over by another executor). */
export const RESUMED_NOTE_MS = 10000;
/** Entries of a plan shown at most. */
export const MAX_PLAN_ENTRIES = 100;
/** How much of the thinking its folded line shows while it goes on. */
export const THINKING_PREVIEW_CHARS = 120;

/**
 * Writes `last_seq` and `status` back to the kernel for one model: at most
 * about twice a second, at once when the status changes.
 */
export class ModelSync {
  /** @param {WidgetModel} model */
  constructor(model) {
    this.model = model;
    /** @type {{runId: string, lastSeq: number, status: string} | null} */
    this.pending = null;
    /** @type {any} */
    this.timer = null;
  }

  /**
   * @param {string} runId
   * @param {number} lastSeq
   * @param {string} status
   * @param {boolean} [now]
   */
  save(runId, lastSeq, status, now = false) {
    // A view still busy with the run before "Run again" must not write over the new one.
    if (runId !== this.model.get("run_id")) return;
    this.pending = { runId, lastSeq, status };
    if (now || status !== this.model.get("status")) this.flush();
    else if (this.timer === null) this.timer = setTimeout(() => this.flush(), SAVE_INTERVAL_MS);
  }

  flush() {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    const pending = this.pending;
    this.pending = null;
    if (pending === null || pending.runId !== this.model.get("run_id")) return;
    let changed = false;
    if (pending.lastSeq > (this.model.get("last_seq") || 0)) {
      this.model.set("last_seq", pending.lastSeq);
      changed = true;
    }
    if (pending.status !== this.model.get("status")) {
      this.model.set("status", pending.status);
      changed = true;
    }
    if (changed) this.model.save_changes();
  }

  dispose() {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
  }
}

/** @type {WeakMap<WidgetModel, ModelSync>} */
const syncs = new WeakMap();

/**
 * The one ModelSync of `model` in this copy of the module.
 * @param {WidgetModel} model
 * @returns {ModelSync}
 */
export function syncFor(model) {
  let sync = syncs.get(model);
  if (sync === undefined) {
    sync = new ModelSync(model);
    syncs.set(model, sync);
  }
  return sync;
}

/**
 * Tell the kernel about a run that "Run again" started: its model follows it from now on.
 * @param {WidgetModel} model
 * @param {Run} run
 */
export function followNewRun(model, run) {
  model.set("run_id", run.run_id);
  model.set("last_seq", 0);
  model.set("status", run.status);
  model.save_changes();
}

/**
 * The host of a view inside an anywidget: the model says which run to show.
 * @param {WidgetModel} model
 * @returns {RunHost}
 */
export function modelHost(model) {
  return {
    runId: () => String(model.get("run_id") || ""),
    baseUrl: () => model.get("base_url") || null,
    reattached: () => Boolean(model.get("reattached")),
    followed: () => String(model.get("followed") || ""),
    // The kernel's copy of the run's record, where it keeps one.
    savedRecord: () => (typeof model.get("record") === "string" && model.get("record")) || null,
    subscribe(callback) {
      const events = ["change:run_id", "change:reattached", "change:followed"];
      for (const event of events) model.on(event, callback);
      return () => {
        for (const event of events) model.off(event, callback);
      };
    },
    save: (runId, lastSeq, status, now) => syncFor(model).save(runId, lastSeq, status, now),
    // The model's change:run_id re-attaches every view of it, this one included.
    ranAgain: (run) => followNewRun(model, run),
    // Where this view shows (no renderer of the extension keeps the output), the kernel keeps the record.
    threadEnded: (runIds) => tellThread(model, runIds),
  };
}

/**
 * Tell the kernel which follow-ups under its run have ended: it brings the run's record
 * up to date in its display (the page that ran the cell applies that to the output).
 * Ended follow-ups only add up: a view that has not seen one yet (another page's, or
 * one drawn again) adds nothing, and two pages never undo each other's word.
 * @param {WidgetModel} model
 * @param {string[]} runIds
 */
export function tellThread(model, runIds) {
  const known = Array.isArray(model.get("thread")) ? model.get("thread").map(String) : [];
  const added = runIds.filter((runId) => !known.includes(runId));
  if (added.length === 0) return;
  model.set("thread", [...known, ...added]);
  model.save_changes();
}

/**
 * One line for an agent-defined event: its fields as `name=value`, values shortened.
 * @param {unknown} data
 * @returns {string}
 */
export function eventSummary(data) {
  if (!isPlainObject(data)) return compactJson(data, 120);
  const parts = Object.entries(data).map(([key, value]) => {
    const text = typeof value === "string" ? value : compactJson(value, 60);
    return `${key}=${text.length > 60 ? `${text.slice(0, 59)}…` : text}`;
  });
  return parts.join(" · ");
}

// What the chip says for a problem of the view (not a status of the run).
/** @type {Record<string, string>} */
const PROBLEMS = {
  not_found: "run not found",
  expired: "expired",
  signed_out: "signed out",
  unreachable: "reconnecting",
  protocol_error: "protocol error",
  error: "error",
};

/** @type {Record<string, string>} */
const CONNECTION_CHIPS = { reconnecting: "reconnecting", signed_out: "signed out", failed: "connection failed" };

/**
 * @typedef {{
 *   node: HTMLElement, body: HTMLElement, scroller: HTMLElement, length: number, done: boolean,
 *   plain: Text | null, renderedAt: number, timer: any,
 * }} MessageEntry
 * @typedef {{
 *   snapshot: object, tools: {tool: Tool, status: string, node: HTMLElement, retry: boolean}[],
 *   inputs: {input: Input, status: string, node: HTMLElement}[],
 *   messages: MessageEntry[], progress: Progress | null | undefined, progressKey: string,
 *   usage: Usage | null | undefined, unknown: UnknownEvent | null | undefined,
 *   thinking: MessageEntry, reasoning: Message, plan: PlanEntry[] | null | undefined,
 * }} Rendered
 */

/** One view of a run: renders its snapshot, then follows it through the hub. */
export class RunView {
  /**
   * @param {RunHost} host
   * @param {HTMLElement} el
   * @param {{thread?: boolean}} [options] `thread: false`: no follow-ups nor box (a follow-up's own view in a thread)
   */
  constructor(host, el, options = {}) {
    this.host = host;
    this.root = element("div", "agentruns-run");

    this.header = element("div", "agentruns-header");
    this.agent = element("span", "agentruns-agent");
    // What the run was asked: user text, shown as text.
    this.title = element("span", "agentruns-title");
    this.chip = element("span", "agentruns-chip");
    this.elapsed = element("span", "agentruns-elapsed");
    this.cancelButton = button("Cancel", "agentruns-cancel");
    this.againButton = button("Run again", "agentruns-again");
    this.cancelButton.addEventListener("click", () => this._cancel());
    this.againButton.addEventListener("click", () => this._runAgain());
    // Both buttons live at the right end, Run again last: it never moves.
    const actions = element("span", "agentruns-actions");
    actions.append(this.cancelButton, this.againButton);
    // A re-run cell that found its run again says so where the eye goes first.
    this.same = element("div", "agentruns-same");
    this.same.hidden = true;
    this.header.append(this.agent, this.title, this.chip, this.elapsed, element("span", "agentruns-spacer"), actions, this.same);

    this.detail = element("div", "agentruns-detail");
    this.meta = element("div", "agentruns-meta");
    this.runIdText = element("code", "agentruns-run-id");
    // Where the labextension runs, the run id opens the run's own page.
    this.runIdText.addEventListener("click", () => {
      if (this.runId && runPagesOpen()) requestRunPage(this.runId);
    });
    this.copyButton = button("copy", "agentruns-copy");
    this.copyButton.title = "Copy the run id";
    this.copyButton.addEventListener("click", () => this._copyRunId());
    this.note = element("span", "agentruns-note");
    // The mode, model and files the run's input chose, where it chose some.
    this.choices = element("span", "agentruns-choices");
    // A fork: where it came from, and Compare with that run (where run pages open).
    this.forked = element("span", "agentruns-forked");
    this.forkedText = element("span", "agentruns-forked-text");
    this.compareButton = button("Compare", "agentruns-compare-open");
    this.compareButton.title = "This run and the one it was forked from, side by side";
    this.compareButton.addEventListener("click", () => {
      const from = this.state?.run?.forked_from;
      if (this.state && isPlainObject(from)) requestCompare(String(from.run_id), this.state.runId);
    });
    this.forked.append(this.forkedText, this.compareButton);
    this.meta.append(this.runIdText, this.copyButton, this.choices, this.forked, this.note);
    this.notice = element("div", "agentruns-notice");

    // The model's thinking, folded: not drawn until opened, then drawn as it grows.
    this.thinking = /** @type {HTMLDetailsElement} */ (element("details", "agentruns-thinking"));
    const thinkingHead = element("summary", "agentruns-thinking-head");
    this.thinkingPreview = element("span", "agentruns-thinking-preview");
    thinkingHead.append(element("span", "agentruns-thinking-label", "Thinking"), this.thinkingPreview);
    this.thinkingBody = element("div", "agentruns-thinking-body");
    this.thinking.append(thinkingHead, this.thinkingBody);
    this.thinking.addEventListener("toggle", () => {
      if (this.thinking.open) this._changed();
    });
    this.plan = element("div", "agentruns-plan");
    // A snapshot without a plan has no "plan" at all: nothing to draw, not even its box.
    this.plan.hidden = true;
    this.tools = element("div", "agentruns-tools");
    // The notebook edits the run made: each in words with its diff, Undo and Undo all.
    this.edits = new EditsSection((edit) => this._undo(edit));
    this.progress = element("div", "agentruns-progress");
    this.progressBar = element("div", "agentruns-progress-bar");
    this.progressFill = element("div", "agentruns-progress-fill");
    this.progressMessage = element("span", "agentruns-progress-message");
    this.progressBar.appendChild(this.progressFill);
    this.progress.append(this.progressBar, this.progressMessage);
    this.inputs = element("div", "agentruns-inputs");
    this.messages = element("div", "agentruns-messages");
    this.usage = element("div", "agentruns-usage");
    this.output = element("div", "agentruns-output");
    this.unknown = element("div", "agentruns-events");
    this.body = element("div", "agentruns-body");
    this.root.append(this.header, this.detail, this.meta, this.notice, this.body);
    // The conversation under it: follow-ups sent from its box, as a thread.
    /** @type {ThreadSection | null} */
    this.thread = null;
    if (options.thread !== false) {
      this.thread = new ThreadSection({
        baseUrl: () => this.api,
        actions: () => this.actions,
        makeView: (threadHost, node) => new RunView(threadHost, node, { thread: false }),
        ended: (runIds) => {
          if (this.host.threadEnded) this.host.threadEnded(runIds);
        },
      });
      this.root.append(this.thread.node);
    }
    el.appendChild(this.root);

    this.attachment = 0;
    /** @type {RunState | null} */
    this.state = null;
    /** @type {{kind: string, message: string} | null} */
    this.problem = null;
    this.connection = "connected";
    /** @type {(() => void) | null} */
    this.unregister = null;
    /** @type {any} */
    this.loadTimer = null;
    /** @type {any} */
    this.frame = null;
    /** @type {any} */
    this.clock = null;
    this.busy = false;
    this.loadAttempt = 0;
    /** @type {Rendered | null} */
    this.rendered = null;
    /** @type {{agent: string, forks: boolean} | undefined} whether the run's agent forks runs (Retry from here) */
    this.forkable = undefined;
    this.unsubscribe = host.subscribe(() => this._hostChanged());
  }

  get api() {
    return apiBase(this.host.baseUrl());
  }

  /** Cancel, Run again, Answer and Undo, on the server this view reads. */
  get actions() {
    return new RunActions({ baseUrl: this.api });
  }

  /**
   * Show and follow `runId`, leaving whatever run this view showed before.
   * @param {string} runId
   */
  attach(runId) {
    this._stopFollowing();
    this.attachment += 1;
    this.state = runId ? new RunState(runId) : null;
    this.problem = null;
    this.connection = "connected";
    this.loadAttempt = 0;
    this._changed();
    if (this.state !== null) this._load(this.attachment);
  }

  /** The run this view shows, or "". */
  get runId() {
    return this.state ? this.state.runId : "";
  }

  dispose() {
    this.attachment += 1;
    this._stopFollowing();
    this.unsubscribe();
    if (this.thread !== null) this.thread.dispose();
    if (this.frame !== null) cancelFrame(this.frame);
    this.frame = null;
    this._stopClock();
    if (this.rendered !== null) for (const entry of [...this.rendered.messages, this.rendered.thinking]) clearTimeout(entry.timer);
  }

  _hostChanged() {
    const runId = this.host.runId();
    if (runId !== this.runId) this.attach(runId);
    else this._changed();
  }

  // Read the run (its snapshot at last_seq), then follow its events from there.
  /** @param {number} attachment */
  async _load(attachment) {
    const state = /** @type {RunState} */ (this.state);
    let response;
    try {
      response = await apiFetch(runsUrl(this.api, state.runId));
    } catch {
      if (attachment === this.attachment) this._retryLoad(attachment, "unreachable", "Cannot reach the server; retrying.");
      return;
    }
    if (attachment !== this.attachment) return;
    if (response.status === 404) return this._fail("not_found", `This server has no run ${state.runId} (or it is not yours).`);
    if (response.status === 410) return this._fail("expired", `The server no longer keeps run ${state.runId} (retention).`);
    if (response.status === 401 || response.status === 403) {
      return this._retryLoad(attachment, "signed_out", "Sign in to Jupyter again; this view retries every 30 s.", 30000);
    }
    if (!response.ok) return this._retryLoad(attachment, "unreachable", `${await errorMessage(response)}; retrying.`);
    let run;
    try {
      run = await response.json();
    } catch {
      run = null;
    }
    if (attachment !== this.attachment) return;
    this.loadAttempt = 0;
    this.problem = null;
    if (state.loadRun(run) === "protocol_error") return this._fail("protocol_error", state.problem || "");
    this._show();
    if (!state.terminal) this._follow();
  }

  /**
   * @param {number} attachment
   * @param {string} kind
   * @param {string} message
   * @param {number} [delay]
   */
  _retryLoad(attachment, kind, message, delay) {
    this.problem = { kind, message };
    this._changed();
    this.loadAttempt += 1;
    const wait = delay || Math.min(30000, LOAD_RETRY_FLOOR_MS * 2 ** this.loadAttempt) * (0.5 + Math.random() / 2);
    this.loadTimer = setTimeout(() => {
      this.loadTimer = null;
      if (attachment === this.attachment) this._load(attachment);
    }, wait);
  }

  // Draw the state soon, and tell the kernel where the run is.
  _show() {
    const state = /** @type {RunState} */ (this.state);
    this._changed();
    this.host.save(state.runId, state.lastSeq, state.status, state.terminal);
  }

  _follow() {
    const attachment = this.attachment;
    const state = this.state;
    if (state === null) return;
    /**
     * @template T
     * @param {(value: T) => void} handler
     */
    const current = (handler) => (/** @type {T} */ value) => {
      if (attachment === this.attachment && this.state === state) handler(value);
    };
    const hub = getStreamHub({ baseUrl: this.api });
    this.unregister = hub.register(state.runId, state.lastSeq, {
      onEvent: current((envelope) => this._event(envelope)),
      onSnapshot: current((run) => this._snapshot(run)),
      onError: current((/** @type {{error: any}} */ frame) => this._streamError(frame)),
      onConnection: current((/** @type {string} */ connection) => {
        this.connection = connection;
        this._changed();
      }),
    });
  }

  _stopFollowing() {
    if (this.unregister !== null) this.unregister();
    this.unregister = null;
    if (this.loadTimer !== null) clearTimeout(this.loadTimer);
    this.loadTimer = null;
  }

  // The stream's events we missed were compacted: it sent the run as it is now.
  /** @param {unknown} run */
  _snapshot(run) {
    const state = /** @type {RunState} */ (this.state);
    if (state.loadRun(run) === "protocol_error") return this._fail("protocol_error", state.problem || "");
    this._show();
    if (state.terminal) this._stopFollowing();
  }

  /** @param {unknown} envelope */
  _event(envelope) {
    const state = /** @type {RunState} */ (this.state);
    const result = state.applyEnvelope(envelope);
    if (result === "applied") {
      this._show();
      if (state.terminal) this._stopFollowing();
    } else if (result === "gap") {
      this._resync();
    } else if (result === "protocol_error") {
      this._fail("protocol_error", state.problem || "");
    }
  }

  // Events were lost, or the cursor is off: the run itself is the authority.
  _resync() {
    this._stopFollowing();
    this._load(this.attachment);
  }

  /** @param {{error: any}} frame */
  _streamError({ error }) {
    const code = error && error.error;
    const message = (error && error.message) || "The server stopped streaming this run.";
    if (code === "run_not_found") this._fail("not_found", message);
    else if (code === "run_expired") this._fail("expired", message);
    else if (code === "cursor_ahead") this._resync(); // the server's answer says what to do
    else this._fail("error", message);
  }

  /**
   * @param {string} kind
   * @param {string} message
   */
  _fail(kind, message) {
    this._stopFollowing();
    this.problem = { kind, message };
    this._changed();
  }

  /**
   * A person's answer to the run's question, from one of its buttons.
   * @param {Input} input
   * @param {string} choice
   * @param {HTMLElement} card
   */
  async _answer(input, choice, card) {
    const state = this.state;
    if (state === null || card.dataset.sending === "true") return;
    card.dataset.sending = "true";
    for (const node of card.querySelectorAll("button")) /** @type {HTMLButtonElement} */ (node).disabled = true;
    try {
      const { problem } = await this.actions.answer(state.runId, input.request_id, choice);
      if (problem !== null) this._say(`Answer failed: ${problem}`);
    } finally {
      // The resolved event redraws the card; until then (or after a failure) it can be used again.
      card.dataset.sending = "false";
      for (const node of card.querySelectorAll("button")) /** @type {HTMLButtonElement} */ (node).disabled = false;
    }
  }

  /**
   * Undo one of the run's notebook edits: null once the server did, else why not.
   * @param {Edit} edit
   * @returns {Promise<string | null>}
   */
  async _undo(edit) {
    const state = this.state;
    if (state === null) return "this view shows no run";
    const outcome = await this.actions.undo(state.runId, edit.edit_id);
    if (outcome.problem !== null) return outcome.problem;
    // The answer is the run with the edit undone: a run that ended is followed
    // no more, and its view learns the edit's new status from it.
    const run = outcome.run;
    if (state === this.state && isPlainObject(run) && typeof run.last_seq === "number" && run.last_seq >= state.lastSeq) this._snapshot(run);
    return null;
  }

  async _cancel() {
    const state = this.state;
    if (state === null || this.busy) return;
    this.busy = true;
    this._changed();
    try {
      const { problem } = await this.actions.cancel(state.runId, "cancelled from the notebook");
      if (problem !== null) this._say(`Cancel failed: ${problem}`);
    } finally {
      this.busy = false;
      this._changed();
    }
  }

  async _runAgain() {
    const state = this.state;
    if (state === null || this.busy) return;
    this.busy = true;
    this._changed();
    try {
      const old = await apiFetch(runsUrl(this.api, state.runId));
      if (!old.ok) return this._say(`Run again failed: ${await errorMessage(old)}`);
      const outcome = await this.actions.runAgain(await old.json());
      if (outcome.problem !== null) return this._say(`Run again failed: ${outcome.problem}`);
      this.host.ranAgain(outcome.run, state.runId);
    } catch {
      this._say(`Run again failed: ${UNREACHABLE}`);
    } finally {
      this.busy = false;
      this._changed();
    }
  }

  async _copyRunId() {
    const runId = this.runId;
    if (!runId) return;
    try {
      await navigator.clipboard.writeText(runId);
      this.copyButton.textContent = "copied";
    } catch {
      // No clipboard here (an insecure origin): select the id for Ctrl+C instead.
      const selection = window.getSelection();
      if (selection !== null) selection.selectAllChildren(this.runIdText);
      this.copyButton.textContent = "selected";
    }
    setTimeout(() => {
      this.copyButton.textContent = "copy";
    }, 1500);
  }

  /**
   * A passing message that does not change what the view follows.
   * @param {string} message
   */
  _say(message) {
    this.problem = { kind: "note", message };
    this._changed();
  }

  // Many events can arrive per frame: draw once per animation frame.
  _changed() {
    if (this.frame === null) {
      this.frame = requestFrame(() => {
        this.frame = null;
        this._render();
      });
    }
  }

  _render() {
    const state = this.state;
    const loaded = state !== null && state.run !== null;
    const status = loaded ? state.status : "";
    this.root.dataset.runId = state ? state.runId : "";
    this.root.dataset.status = status;
    this.root.dataset.lastSeq = String(loaded ? state.lastSeq : 0);
    // Which executor's attempt the view has seen: 2 once it saw the run taken over.
    this.root.dataset.attempt = String(loaded ? state.attempt : 0);
    this._renderHeader(status);
    this._renderMeta();
    this._renderClock();
    if (state === null || state.run === null) {
      this._renderRecord();
      return;
    }
    if (this.rendered === null || this.rendered.snapshot !== state.snapshot) this._resetBody(state);
    const rendered = /** @type {Rendered} */ (this.rendered);
    this._renderThinking(rendered, state);
    this._renderPlan(rendered, state.snapshot.plan);
    this._renderTools(rendered, state);
    this.edits.render(runEdits(state.snapshot));
    this._renderInputs(rendered, state.snapshot.inputs || []);
    this._renderProgress(rendered, state);
    this._renderMessages(rendered, state.snapshot.messages, state.textBytes > 0);
    this._renderUsage(rendered, state.snapshot.usage);
    this._renderOutput(state);
    this._renderUnknown(rendered, state.unknown);
    if (this.thread !== null) {
      this.thread.node.hidden = false;
      this.thread.show(/** @type {Run} */ (state.run), status);
    }
    if (this.host.shown) this.host.shown(state);
  }

  /** @param {string} status */
  _renderHeader(status) {
    const state = this.state;
    const active = ACTIVE_STATUSES.has(status);
    this.agent.textContent = state && state.run ? state.run.agent : "agent run";
    const title = state && state.run ? runTitle(state.run) : "";
    // The agent's name alone is no title: it is shown already.
    this.title.textContent = title !== this.agent.textContent ? title : "";
    this.title.title = this.title.textContent;
    this.title.hidden = this.title.textContent === "";
    let chip = status || "loading";
    let kind = status || "queued";
    let detail = "";
    if (this.problem !== null && this.problem.kind !== "note") {
      chip = PROBLEMS[this.problem.kind];
      kind = this.problem.kind;
    } else if (active && this.connection !== "connected" && this.unregister !== null) {
      chip = CONNECTION_CHIPS[this.connection];
      kind = this.connection;
    } else if (state && status === "failed" && state.error) {
      detail = `${state.error.type}: ${state.error.message}`;
    } else if (state && active && state.resumedAt && Date.now() - Date.parse(state.resumedAt) < RESUMED_NOTE_MS) {
      detail = `resumed (attempt ${state.attempt})`;
    } else if (state && status === "queued" && state.run && typeof state.run.queued_behind === "string") {
      detail = `queued behind ${state.run.queued_behind}`;
    } else if (state && status === "cancelled" && state.cancel && state.cancel.reason) {
      detail = cancelledWords(state.cancel.reason);
    } else if (state && status === "interrupted" && state.interruptReason) {
      detail = `interrupted: ${describeReason(state.interruptReason)}`;
    }
    this.chip.textContent = chip;
    this.chip.dataset.kind = kind;
    this.detail.textContent = detail;
    this.detail.hidden = detail === "";
    this.notice.textContent = this.problem ? this.problem.message : "";
    this.notice.hidden = this.problem === null;
    const loaded = state !== null && state.run !== null && (this.problem === null || this.problem.kind === "note");
    this.cancelButton.hidden = !(loaded && active);
    this.cancelButton.disabled = this.busy || status === "cancelling";
    this.againButton.hidden = !(loaded && isTerminal(status));
    this.againButton.disabled = this.busy;
    const same = loaded && this._sameRun();
    this.same.textContent = same ? sameRunWords(status) : "";
    this.same.hidden = !same;
  }

  /** True when re-running the cell found the run it had started before (and no Run again replaced it). */
  _sameRun() {
    const followed = this.host.followed();
    return this.host.reattached() && !(followed && this.state !== null && followed !== this.state.runId);
  }

  _renderMeta() {
    const state = this.state;
    const runId = state ? state.runId : "";
    this.meta.hidden = runId === "";
    this.runIdText.textContent = runId;
    const linked = runPagesOpen();
    this.runIdText.classList.toggle("agentruns-run-id--link", linked);
    this.runIdText.title = linked ? "Open this run's page" : "";
    this.choices.textContent = choiceWords(state && state.run ? state.run.input : null);
    this.choices.hidden = this.choices.textContent === "";
    const from = state && state.run ? state.run.forked_from : null;
    this.forked.hidden = !isPlainObject(from);
    this.forkedText.textContent = isPlainObject(from) ? `forked from ${from.run_id} after event ${from.seq}` : "";
    this.compareButton.hidden = !linked;
    const followed = this.host.followed();
    const created = parseTime(state && state.run ? state.run.created_at : null);
    let note = "";
    if (followed && followed !== runId) {
      note = `following ${runId} (Run again of ${followed})`;
    } else if (this.host.reattached()) {
      note = `re-attached to ${runId}${created === null ? "" : ` (started ${formatAgo(created, Date.now())})`}`;
    }
    this.note.textContent = note;
    this.note.hidden = note === "";
  }

  // Start time and elapsed time; ticking only while the run is going.
  _renderClock() {
    const state = this.state;
    const run = state && state.run;
    // "resumed (attempt N)" is said for a while, then the header goes back to normal.
    if (state && state.resumedAt && this.detail.textContent.startsWith("resumed")) {
      this._renderHeader(state.status);
    }
    if (!state || !run) {
      this.elapsed.textContent = "";
      this._stopClock();
      return;
    }
    const created = parseTime(run.created_at);
    const started = parseTime(state.startedAt);
    const at = started ?? created;
    if (at === null) {
      this.elapsed.textContent = "";
      return;
    }
    // A run that never started shows when it was made, and says it never started.
    this.elapsed.title = `${started === null ? "created" : "started"} ${new Date(at).toLocaleString()}`;
    const now = Date.now();
    const silence = silenceWords(state, now);
    this.elapsed.textContent = [clockTime(at), timingWords(state, now), silence].filter(Boolean).join(" · ");
    this.elapsed.classList.toggle("agentruns-elapsed--silent", silence !== "");
    if (state.terminal || this.problem !== null) this._stopClock();
    else if (this.clock === null) this.clock = setInterval(() => this._renderClock(), CLOCK_TICK_MS);
  }

  _stopClock() {
    if (this.clock !== null) clearInterval(this.clock);
    this.clock = null;
  }

  // A run this server does not have: the record the notebook saved, if any.
  _renderRecord() {
    const record = this.host.savedRecord();
    const kind = this.problem && this.problem.kind;
    if (record === null || (kind !== "not_found" && kind !== "expired")) {
      this.body.replaceChildren();
      this.rendered = null;
      return;
    }
    const saved = element("div", "agentruns-record");
    renderMarkdown(saved, record);
    // The record holds the thread as it was saved: no box to continue a conversation the server lost.
    if (this.thread !== null) this.thread.node.hidden = true;
    this.notice.textContent = `${this.problem ? this.problem.message : ""} Below is the record saved in the notebook.`;
    this.body.replaceChildren(saved);
    this.rendered = null;
  }

  /** @param {RunState} state */
  _resetBody(state) {
    if (this.rendered !== null) for (const entry of [...this.rendered.messages, this.rendered.thinking]) clearTimeout(entry.timer);
    this.tools.replaceChildren();
    this.inputs.replaceChildren();
    this.messages.replaceChildren();
    this.unknown.replaceChildren();
    this.edits.reset();
    // Rendered as messages are, under a class of its own: the thinking is not the answer.
    const text = element("div", "agentruns-reasoning");
    this.thinkingBody.replaceChildren(text);
    /** @type {MessageEntry} */
    const thinking = { node: text, body: text, scroller: this.thinkingBody, length: 0, done: false, plain: null, renderedAt: 0, timer: null };
    this.body.replaceChildren(
      this.thinking, this.plan, this.tools, this.edits.node, this.inputs, this.progress, this.messages, this.usage, this.output,
      this.unknown
    );
    this.rendered = {
      snapshot: state.snapshot, tools: [], inputs: [], messages: [], progress: undefined, progressKey: "", usage: undefined,
      unknown: undefined, thinking, reasoning: { id: "", role: "assistant", text: "", done: false }, plan: undefined,
    };
  }

  /**
   * The thinking so far, folded; while it goes on, its folded line shows the newest of it.
   * @param {Rendered} rendered
   * @param {RunState} state
   */
  _renderThinking(rendered, state) {
    const reasoning = state.snapshot.reasoning;
    const text = typeof reasoning === "string" ? reasoning : "";
    const box = this.thinking;
    box.hidden = text === "";
    // It goes on until the answer starts or the run ends.
    const live = text !== "" && !state.terminal && state.textBytes === 0;
    box.classList.toggle("agentruns-thinking--live", live);
    this.thinkingPreview.textContent = live ? thinkingPreview(text) : "";
    const entry = rendered.thinking;
    if (!box.open || (text.length === entry.length && !live === entry.done)) return;
    // One object that the scheduled render reads when it comes: it takes the newest text.
    rendered.reasoning.text = text;
    rendered.reasoning.done = !live;
    this._renderMessageText(entry, rendered.reasoning);
  }

  /**
   * The agent's plan as a checklist (each update replaces the last).
   * @param {Rendered} rendered
   * @param {PlanEntry[] | undefined} plan
   */
  _renderPlan(rendered, plan) {
    if (rendered.plan === plan) return;
    rendered.plan = plan;
    const entries = Array.isArray(plan) ? plan : [];
    this.plan.hidden = entries.length === 0;
    this.plan.replaceChildren(...planElements(entries));
  }

  /**
   * @param {Rendered} rendered
   * @param {Input[]} inputs
   */
  _renderInputs(rendered, inputs) {
    const cards = rendered.inputs;
    const box = this.inputs;
    inputs.forEach((input, index) => {
      const card = cards[index];
      if (card && card.input === input && card.status === input.status) return;
      const node = inputCard(input, (choice, cardNode) => this._answer(input, choice, cardNode));
      if (card) card.node.replaceWith(node);
      else box.appendChild(node);
      cards[index] = { input, status: input.status, node };
    });
    box.hidden = inputs.length === 0;
  }

  /**
   * The steps; once the run ended, each with Retry from here where its agent forks runs.
   * @param {Rendered} rendered
   * @param {RunState} state
   */
  _renderTools(rendered, state) {
    const tools = state.snapshot.tools;
    const cards = rendered.tools;
    const box = this.tools;
    const retry = state.terminal && this._forks(state);
    tools.forEach((tool, index) => {
      const card = cards[index];
      if (card && card.tool === tool && card.status === tool.status && card.retry === retry) return;
      const node = toolCard(tool);
      if (retry) node.appendChild(this._retryButton(state, index, node));
      if (card) card.node.replaceWith(node);
      else box.appendChild(node);
      cards[index] = { tool, status: tool.status, node, retry };
    });
    box.hidden = tools.length === 0;
  }

  /**
   * Whether the run's agent forks runs (GET agents says so); asked once, drawn again when known.
   * @param {RunState} state
   */
  _forks(state) {
    const agent = state.run?.agent;
    if (typeof agent !== "string") return false;
    if (this.forkable === undefined || this.forkable.agent !== agent) {
      const asked = { agent, forks: false };
      this.forkable = asked;
      pageAgents(this.api)
        .agent(agent)
        .then((described) => {
          if (this.forkable === asked && described?.forks === true) {
            asked.forks = true;
            this._changed();
          }
        })
        .catch(() => {});
    }
    return this.forkable.forks;
  }

  /**
   * Retry from here: opens the form under the step (a second click closes it).
   * @param {RunState} state
   * @param {number} index
   * @param {HTMLElement} card
   */
  _retryButton(state, index, card) {
    const node = button("Retry from here", "agentruns-retry");
    node.title = "Start a new run from before this step, with the prompt edited if you like";
    /** @type {HTMLElement | null} */
    let form = null;
    const close = () => {
      form?.remove();
      form = null;
      node.setAttribute("aria-expanded", "false");
    };
    node.setAttribute("aria-expanded", "false");
    node.addEventListener("click", () => {
      if (form !== null) return close();
      form = retryForm({
        runId: state.runId,
        index,
        input: state.run?.input,
        baseUrl: this.api,
        actions: this.actions,
        started: (run) => {
          if (runPagesOpen()) requestRunPage(run.run_id);
        },
        close,
      });
      card.appendChild(form);
      node.setAttribute("aria-expanded", "true");
      /** @type {HTMLElement | null} */ (form.querySelector("textarea:not([hidden]), .agentruns-retry-go"))?.focus();
    });
    return node;
  }

  /**
   * A bar while the run works; never empty while text streams, and still once it has stopped.
   * @param {Rendered} rendered
   * @param {RunState} state
   */
  _renderProgress(rendered, state) {
    const progress = state.snapshot.progress;
    const box = this.progress;
    const streaming = state.textBytes > 0;
    const key = `${state.status}|${streaming}`;
    if (rendered.progress === progress && rendered.progressKey === key) return;
    rendered.progress = progress;
    rendered.progressKey = key;
    // A run that ended is in no phase any more: its last progress (searching,
    // waiting for approval) is not where it stopped, and the header says how it ended.
    box.hidden = progress === null || isTerminal(state.status);
    if (box.hidden || progress === null) return;
    const fraction = typeof progress.fraction === "number" ? Math.min(1, Math.max(0, progress.fraction)) : null;
    const percent = fraction === null ? null : Math.round(fraction * 100);
    // Nothing measured yet but text is coming: the run is visibly working.
    const indeterminate = fraction === null || (fraction === 0 && streaming);
    box.classList.toggle("agentruns-progress--indeterminate", indeterminate);
    this.progressFill.style.width = indeterminate ? "" : `${percent ?? 0}%`;
    this.progressBar.title = percent === null ? "working" : `${percent}%`;
    this.progressMessage.textContent = progressWords(state.status, { ...progress, fraction: indeterminate ? null : fraction });
  }

  /**
   * @param {Rendered} rendered
   * @param {Message[]} messages
   * @param {boolean} hasText
   */
  _renderMessages(rendered, messages, hasText) {
    const box = this.messages;
    // An empty box for a message that has not said anything yet is only noise.
    box.hidden = !hasText;
    if (!hasText) return;
    const shown = rendered.messages;
    messages.forEach((message, index) => {
      let entry = shown[index];
      if (!entry) {
        entry = messageEntry(message, box);
        box.appendChild(entry.node);
        shown[index] = entry;
      }
      if (message.text.length === entry.length && message.done === entry.done) return;
      entry.node.classList.toggle("agentruns-message--done", message.done);
      this._renderMessageText(entry, message);
    });
  }

  /**
   * Only the message that changed is rendered again, at most every MARKDOWN_INTERVAL_MS.
   * @param {MessageEntry} entry
   * @param {Message} message
   */
  _renderMessageText(entry, message) {
    if (message.text.length > MAX_MARKDOWN_CHARS) {
      // Too long to parse again and again: plain text, appended as it comes.
      if (entry.plain === null) {
        clearTimeout(entry.timer);
        entry.timer = null;
        const pre = element("pre", "agentruns-plain");
        entry.plain = document.createTextNode(message.text);
        pre.appendChild(entry.plain);
        entry.body.replaceChildren(pre);
      } else if (message.text.length > entry.length) {
        entry.plain.appendData(message.text.slice(entry.length));
      }
      entry.length = message.text.length;
      entry.done = message.done;
      return;
    }
    if (entry.timer !== null) return; // a render is due; it will take the newest text
    const wait = entry.renderedAt + MARKDOWN_INTERVAL_MS - Date.now();
    const draw = () => {
      entry.timer = null;
      this._drawMarkdown(entry, message);
    };
    if (message.done || wait <= 0) draw();
    else entry.timer = setTimeout(draw, wait);
  }

  /**
   * @param {MessageEntry} entry
   * @param {Message} message
   */
  _drawMarkdown(entry, message) {
    const box = entry.scroller;
    // A view attached to a run under way (a refresh, a re-run cell, a run's page) draws
    // text that is already long: it starts at its top, its first line, not at its end.
    const first = entry.renderedAt === 0 && box.textContent === "";
    // Then follow the text only while the reader is at the bottom; never yank them back down.
    const atBottom = !first && box.scrollTop + box.clientHeight >= box.scrollHeight - 8;
    renderMarkdown(entry.body, message.text);
    entry.length = message.text.length;
    entry.done = message.done;
    entry.renderedAt = Date.now();
    if (atBottom) box.scrollTop = box.scrollHeight;
  }

  /**
   * @param {Rendered} rendered
   * @param {Usage | null} usage
   */
  _renderUsage(rendered, usage) {
    if (rendered.usage === usage) return;
    rendered.usage = usage;
    const box = this.usage;
    box.hidden = usage === null;
    if (usage === null) return;
    const about = usage.estimated ? "≈ " : "";
    box.textContent = `tokens: ${about}${formatTokens(usage.input_tokens)} in · ${formatTokens(usage.output_tokens)} out`;
    if (isCost(usage.cost)) box.textContent += ` · cost ${formatCost(/** @type {number} */ (usage.cost))}`;
    if (usage.estimated) box.textContent += " (estimated: no counts were reported)";
  }

  /** @param {RunState} state */
  _renderOutput(state) {
    // Text the agent streamed already says it; show the output for agents that stream none.
    const show = state.status === "succeeded" && state.output !== null && state.snapshot.messages.length === 0;
    const box = this.output;
    box.hidden = !show;
    if (show) box.textContent = `output: ${compactJson(state.output, 500)}`;
  }

  /**
   * Agent-defined events: one line each, the whole data on a click.
   * @param {Rendered} rendered
   * @param {UnknownEvent[]} unknown
   */
  _renderUnknown(rendered, unknown) {
    const last = unknown[unknown.length - 1];
    if (rendered.unknown === last) return;
    rendered.unknown = last;
    const box = this.unknown;
    box.replaceChildren(...unknown.map(eventLine));
    box.hidden = unknown.length === 0;
  }
}

/**
 * @param {UnknownEvent} event
 * @returns {HTMLElement}
 */
function eventLine(event) {
  const line = element("details", "agentruns-event");
  const summary = element("summary");
  summary.append(element("span", "agentruns-event-type", event.type), element("span", "agentruns-event-summary", eventSummary(event.data)));
  let full = JSON.stringify(event.data, null, 2) ?? String(event.data);
  if (full.length > 20000) full = `${full.slice(0, 20000)}…`;
  line.append(summary, element("pre", "agentruns-event-data", full));
  return line;
}

/**
 * The newest of the thinking, on one line.
 * @param {string} text
 * @returns {string}
 */
export function thinkingPreview(text) {
  const tail = text.slice(-4 * THINKING_PREVIEW_CHARS).replace(/\s+/g, " ").trim();
  return tail.length > THINKING_PREVIEW_CHARS ? `…${tail.slice(-THINKING_PREVIEW_CHARS)}` : tail;
}

/** @type {Record<string, {mark: string, words: string}>} */
const PLAN_STATUSES = {
  completed: { mark: "✓", words: "done" },
  in_progress: { mark: "◐", words: "in progress" },
  pending: { mark: "○", words: "to do" },
};

/**
 * A plan as a checklist: how much is done, then each entry with its status and priority.
 * @param {PlanEntry[]} entries
 * @returns {HTMLElement[]}
 */
export function planElements(entries) {
  if (entries.length === 0) return [];
  const done = entries.filter((entry) => isPlainObject(entry) && entry.status === "completed").length;
  const head = element("div", "agentruns-plan-head");
  head.append(element("span", "agentruns-plan-title", "Plan"), element("span", "agentruns-plan-count", `${done} of ${entries.length} done`));
  const list = element("ul", "agentruns-plan-entries");
  for (const entry of entries.slice(0, MAX_PLAN_ENTRIES)) {
    /** @type {Record<string, any>} */
    const fields = isPlainObject(entry) ? entry : {};
    const status = typeof fields.status === "string" && hasOwn(PLAN_STATUSES, fields.status) ? fields.status : "pending";
    const item = element("li", "agentruns-plan-entry");
    item.dataset.status = status;
    const mark = element("span", "agentruns-plan-mark", PLAN_STATUSES[status].mark);
    mark.title = PLAN_STATUSES[status].words;
    mark.setAttribute("role", "img");
    mark.setAttribute("aria-label", PLAN_STATUSES[status].words);
    const content = typeof fields.content === "string" ? fields.content : compactJson(fields.content ?? "", 200);
    item.append(mark, element("span", "agentruns-plan-content", content.length > 500 ? `${content.slice(0, 499)}…` : content));
    if (typeof fields.priority === "string" && fields.priority) {
      const priority = element("span", "agentruns-plan-priority", fields.priority.slice(0, 20));
      priority.dataset.priority = fields.priority;
      item.appendChild(priority);
    }
    list.appendChild(item);
  }
  if (entries.length > MAX_PLAN_ENTRIES) {
    list.appendChild(element("li", "agentruns-plan-more", `… and ${entries.length - MAX_PLAN_ENTRIES} more`));
  }
  return [head, list];
}

/**
 * A tool step: its kind, its title (else its name and arguments), its status, and what it showed.
 * @param {Tool} tool
 * @returns {HTMLElement}
 */
function toolCard(tool) {
  const card = element("div", `agentruns-tool agentruns-tool--${tool.status}`);
  const head = element("div", "agentruns-tool-head");
  const kind = kindLabel(tool.kind);
  if (kind !== null) head.appendChild(kind);
  if (typeof tool.title === "string" && tool.title) {
    const title = element("span", "agentruns-tool-title", tool.title);
    // What the title stands for, on hover: the call as the agent made it.
    title.title = `${tool.name} ${compactJson(tool.args, 200)}`;
    head.appendChild(title);
  } else {
    head.append(element("span", "agentruns-tool-name", String(tool.name)), element("span", "agentruns-tool-args", compactJson(tool.args, 80)));
  }
  head.appendChild(element("span", "agentruns-tool-status", tool.status));
  card.appendChild(head);
  const code = ranCode(tool);
  // An execute_cell step's text says what the cell showed; its images are kept in its result.
  const ranCell = tool.name === "execute_cell";
  if (code !== null) card.appendChild(codeBlock(code));
  if (tool.status === "failed") {
    const error = tool.error;
    const text = error && error.message ? `${error.type || "error"}: ${error.message}` : compactJson(error, 160);
    card.appendChild(element("div", "agentruns-tool-result", text));
  } else if (tool.status === "completed" && tool.result !== null && tool.result !== undefined && code === null && !ranCell) {
    card.appendChild(element("div", "agentruns-tool-result", compactJson(tool.result, 160)));
  }
  const content = toolContent(tool.content);
  if (content !== null) card.appendChild(content);
  if (code !== null) {
    for (const image of codeImages(tool)) card.appendChild(image);
    card.appendChild(insertButton(code));
  } else if (ranCell && tool.status === "completed") {
    for (const image of codeImages(tool)) card.appendChild(image);
  }
  return card;
}

/**
 * The code of a notebook tools' run_code step (what ran, or is about to, in the kernel), else null.
 * @param {Tool} tool
 */
function ranCode(tool) {
  const args = /** @type {any} */ (tool.args);
  return tool.name === "run_code" && args && typeof args.code === "string" ? args.code : null;
}

const IMAGE_TYPES = new Set(["image/png", "image/jpeg"]);
const BASE64 = /^[A-Za-z0-9+/=\s]+$/;

/**
 * The images a run_code or execute_cell step's code displayed (kept in its result), as inline images:
 * only PNG and JPEG, only base64 data, never a URL.
 * @param {Tool} tool
 * @returns {HTMLImageElement[]}
 */
function codeImages(tool) {
  const result = /** @type {any} */ (tool.result);
  /** @type {any[]} */
  const images = result && Array.isArray(result.images) ? result.images : [];
  return images
    .filter((image) => image && IMAGE_TYPES.has(image.mime) && typeof image.data === "string" && BASE64.test(image.data))
    .map((image) => {
      const node = /** @type {HTMLImageElement} */ (element("img", "agentruns-tool-image"));
      node.alt = "an image the code displayed";
      node.src = `data:${image.mime};base64,${image.data.replace(/\s/g, "")}`;
      return node;
    });
}

/**
 * "Insert as cell": asks the notebook around the view (the labextension listens for
 * `agentruns:insert-cell`) to put the code into a new cell below the run's cell; where
 * nothing answers (no JupyterLab), the code goes to the clipboard instead.
 * @param {string} code
 */
function insertButton(code) {
  const node = button("Insert as cell", "agentruns-insert-cell");
  node.title = "Put this code into a new cell below this one";
  node.addEventListener("click", () => {
    // The page's own CustomEvent (the view may be in another window than this module's globals).
    const page = /** @type {any} */ (node.ownerDocument.defaultView);
    const asked = new page.CustomEvent("agentruns:insert-cell", { bubbles: true, cancelable: true, detail: { code } });
    if (node.dispatchEvent(asked)) {
      if (typeof navigator !== "undefined" && navigator.clipboard) void navigator.clipboard.writeText(code).catch(() => {});
      node.textContent = "Copied";
    } else {
      node.textContent = "Inserted";
    }
  });
  return node;
}

/**
 * @param {Message} message
 * @param {HTMLElement} scroller the box that scrolls with the text
 * @returns {MessageEntry}
 */
function messageEntry(message, scroller) {
  const node = element("div", "agentruns-message");
  node.dataset.role = message.role || "assistant";
  if (message.role && message.role !== "assistant") node.appendChild(element("div", "agentruns-role", message.role));
  const body = element("div", "agentruns-markdown");
  node.appendChild(body);
  return { node, body, scroller, length: 0, done: false, plain: null, renderedAt: 0, timer: null };
}

/** @param {() => void} callback */
function requestFrame(callback) {
  if (typeof requestAnimationFrame === "function") return requestAnimationFrame(callback);
  return setTimeout(callback, 16);
}

/** @param {any} handle */
function cancelFrame(handle) {
  if (typeof cancelAnimationFrame === "function") cancelAnimationFrame(handle);
  else clearTimeout(handle);
}

/**
 * A cancel or interrupt reason in words: a string as it is, a session's interrupt by its run.
 * @param {any} reason
 */
export function describeReason(reason) {
  if (typeof reason === "string") return reason;
  if (reason && typeof reason === "object" && typeof reason.interrupted_by === "string") {
    return `interrupted by ${reason.interrupted_by}`;
  }
  return compactJson(reason, 200);
}

export { formatAgo, formatDuration };
