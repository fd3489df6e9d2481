// The client reducer: one view's state of one run, guarded against bad input.

import { hasOwn, isPlainObject, isSeq } from "./json.js";
import { applyEvent, emptySnapshot, openInputs } from "./reducer.js";
import { TERMINAL_TYPES, isTerminal } from "./status.js";

/**
 * @typedef {import("./reducer.js").Snapshot} Snapshot
 * @typedef {{type?: string, message?: string}} RunError
 * @typedef {{requested_at: string | null, reason: any, stage: any}} Cancel
 * @typedef {{
 *   run_id: string, agent: string, title?: string, status: string, session?: string | null,
 *   metadata?: Record<string, any> | null, input?: any, retry_of?: string | null, forked_from?: {run_id: string, seq: number} | null, queued_behind?: string | null,
 *   attempt?: number,
 *   created_at?: string | null, started_at?: string | null, finished_at?: string | null,
 *   last_seq: number, first_seq?: number, snapshot: Snapshot,
 *   output?: any, error?: RunError | null, cancel?: Cancel | null, last_event_at?: string | null,
 * }} Run
 * @typedef {{run_id: string, seq: number, type: string, ts: string, data: Record<string, any>}} Envelope
 * @typedef {{seq: number, type: string, data: Record<string, any>}} UnknownEvent
 * @typedef {"applied" | "duplicate" | "gap" | "protocol_error"} ApplyResult
 */

/** One text.delta (or reasoning.delta) larger than this is a protocol error, not text to render. */
export const MAX_DELTA_BYTES = 64 * 1024;
/** A run whose text (or whose thinking) grows beyond this is a protocol error. */
export const MAX_TEXT_BYTES = 8 * 1024 * 1024;
/** How many unknown events a view keeps to show generically. */
export const MAX_UNKNOWN_EVENTS = 20;

// The reducer's own types plus the lifecycle ones: all others are "unknown".
const KNOWN_TYPES = new Set([
  "run.started",
  "run.resumed",
  "run.cancel_requested",
  "message.started",
  "text.delta",
  "message.completed",
  "tool.started",
  "tool.completed",
  "progress",
  "usage",
  "input.requested",
  "input.resolved",
  "reasoning.delta",
  "plan.updated",
  // The edits section of the view shows them: not listed again as agent-defined events.
  "notebook.edit",
  ...Object.keys(TERMINAL_TYPES),
]);

// The data fields without which a known event cannot be applied.
/** @type {Record<string, string[]>} */
const REQUIRED_TEXT_FIELDS = {
  "message.started": ["message_id"],
  "text.delta": ["message_id", "delta"],
  "message.completed": ["message_id"],
  "tool.started": ["call_id", "name"],
  "tool.completed": ["call_id"],
  "reasoning.delta": ["delta"],
};

/**
 * The UTF-8 size of a string, without allocating its bytes.
 * @param {string} text
 * @returns {number}
 */
export function utf8Length(text) {
  let bytes = 0;
  for (let i = 0; i < text.length; i++) {
    const code = text.charCodeAt(i);
    if (code < 0x80) bytes += 1;
    else if (code < 0x800) bytes += 2;
    else if (code >= 0xd800 && code <= 0xdbff && i + 1 < text.length) {
      bytes += 4; // a surrogate pair is one 4-byte character
      i += 1;
    } else bytes += 3;
  }
  return bytes;
}

/**
 * @param {any} envelope
 * @param {string} runId
 * @returns {string | null}
 */
function envelopeProblem(envelope, runId) {
  if (!isPlainObject(envelope)) return "an event that is not a JSON object";
  if (envelope.run_id !== runId) return `an event of run ${envelope.run_id}, not ${runId}`;
  if (!isSeq(envelope.seq) || envelope.seq === 0) return `an event whose seq is ${JSON.stringify(envelope.seq)}`;
  if (typeof envelope.type !== "string" || envelope.type === "") return `event ${envelope.seq} has no type`;
  if (typeof envelope.ts !== "string") return `event ${envelope.seq} has no ts`;
  if (!isPlainObject(envelope.data)) return `event ${envelope.seq} has no data object`;
  for (const field of REQUIRED_TEXT_FIELDS[envelope.type] || []) {
    if (typeof envelope.data[field] !== "string") {
      return `event ${envelope.seq} (${envelope.type}) has no text field ${field}`;
    }
  }
  return null;
}

/**
 * @param {any} run
 * @param {string} runId
 * @returns {string | null}
 */
function runProblem(run, runId) {
  if (!isPlainObject(run)) return "a run that is not a JSON object";
  if (run.run_id !== runId) return `run ${run.run_id} answered for ${runId}`;
  if (!isSeq(run.last_seq)) return `a run whose last_seq is ${JSON.stringify(run.last_seq)}`;
  if (typeof run.status !== "string") return "a run without a status";
  const snapshot = run.snapshot;
  if (!isPlainObject(snapshot) || !Array.isArray(snapshot.messages) || !Array.isArray(snapshot.tools)) {
    return "a run without a snapshot";
  }
  if (!snapshot.messages.every((message) => isPlainObject(message) && typeof message.text === "string")) {
    return "a run whose snapshot has a message without text";
  }
  return null;
}

/**
 * @param {Record<string, any>} data
 * @param {string} key
 */
function get(data, key) {
  return hasOwn(data, key) ? data[key] : null;
}

/**
 * One view's state of one run: the snapshot at `lastSeq` and the run's status.
 *
 * Events go through `applyEnvelope`, which de-duplicates by seq, reports holes,
 * and refuses malformed or absurdly large input instead of rendering it.
 */
export class RunState {
  /** @param {string} runId */
  constructor(runId) {
    this.runId = runId;
    /** @type {Run | null} the run object last loaded */
    this.run = null;
    /** @type {Snapshot} */
    this.snapshot = emptySnapshot();
    this.lastSeq = 0;
    this.status = "queued";
    /** @type {any} */
    this.output = null;
    /** @type {RunError | null} */
    this.error = null;
    /** @type {Cancel | null} */
    this.cancel = null;
    /** @type {any} */
    this.interruptReason = null;
    /** @type {string | null} */
    this.startedAt = null;
    /** @type {string | null} */
    this.finishedAt = null;
    /** Which executor's attempt runs it: more than 1 once it was taken over (run.resumed). */
    this.attempt = 1;
    /** @type {string | null} when the last takeover seen here happened */
    this.resumedAt = null;
    /** @type {string | null} when the run began to wait for an answer, if this view saw it */
    this.waitingSince = null;
    /** @type {string | null} when its last event came (what a silence is counted from) */
    this.lastEventAt = null;
    /** @type {UnknownEvent[]} */
    this.unknown = [];
    /** @type {string | null} */
    this.problem = null;
    this.textBytes = 0;
    this.reasoningBytes = 0;
  }

  get terminal() {
    return isTerminal(this.status);
  }

  /**
   * Take the state from a run object (`GET runs/{id}` or a snapshot frame).
   * @param {unknown} run
   * @returns {"loaded" | "protocol_error"}
   */
  loadRun(run) {
    const problem = runProblem(run, this.runId);
    if (problem !== null) return this._refuse(problem);
    const loaded = /** @type {Run} */ (run);
    const textBytes = loaded.snapshot.messages.reduce((sum, message) => sum + utf8Length(message.text), 0);
    if (textBytes > MAX_TEXT_BYTES) return this._refuse(`the run's text is over ${MAX_TEXT_BYTES} bytes`);
    const reasoning = loaded.snapshot.reasoning;
    const reasoningBytes = typeof reasoning === "string" ? utf8Length(reasoning) : 0;
    if (reasoningBytes > MAX_TEXT_BYTES) return this._refuse(`the run's thinking is over ${MAX_TEXT_BYTES} bytes`);
    this.run = loaded;
    this.snapshot = structuredClone(loaded.snapshot);
    this.lastSeq = loaded.last_seq;
    this.status = loaded.status;
    this.output = loaded.output ?? null;
    this.error = loaded.error ?? null;
    this.cancel = loaded.cancel ?? null;
    this.startedAt = loaded.started_at ?? null;
    this.finishedAt = loaded.finished_at ?? null;
    this.attempt = typeof loaded.attempt === "number" ? loaded.attempt : 1;
    this.lastEventAt = typeof loaded.last_event_at === "string" ? loaded.last_event_at : null;
    // The run object does not say since when it waits: a later question's event will.
    if (this.status !== "waiting") this.waitingSince = null;
    this.interruptReason = null;
    this.unknown = [];
    this.problem = null;
    this.textBytes = textBytes;
    this.reasoningBytes = reasoningBytes;
    return "loaded";
  }

  /**
   * Apply one event envelope.
   * @param {unknown} envelope
   * @returns {ApplyResult}
   */
  applyEnvelope(envelope) {
    if (this.problem !== null) return "protocol_error";
    const problem = envelopeProblem(envelope, this.runId);
    if (problem !== null) return this._refuse(problem);
    const event = /** @type {Envelope} */ (envelope);
    if (event.seq <= this.lastSeq) return "duplicate";
    // A hole means events were lost: only rereading the run can repair it.
    if (event.seq > this.lastSeq + 1) return "gap";
    let deltaBytes = 0;
    if (event.type === "text.delta" || event.type === "reasoning.delta") {
      deltaBytes = utf8Length(event.data.delta);
      if (deltaBytes > MAX_DELTA_BYTES) {
        return this._refuse(`event ${event.seq} carries a ${event.type} of ${deltaBytes} bytes (limit ${MAX_DELTA_BYTES})`);
      }
      const [grown, what] = event.type === "text.delta" ? [this.textBytes, "text"] : [this.reasoningBytes, "thinking"];
      if (grown + deltaBytes > MAX_TEXT_BYTES) {
        return this._refuse(`the run's ${what} grew over ${MAX_TEXT_BYTES} bytes`);
      }
    }
    applyEvent(this.snapshot, event);
    if (event.type === "text.delta") this.textBytes += deltaBytes;
    else if (event.type === "reasoning.delta") this.reasoningBytes += deltaBytes;
    this.lastSeq = event.seq;
    this._record(event);
    return "applied";
  }

  // What the snapshot does not hold: the status and its details, and unknown events.
  /** @param {Envelope} event */
  _record({ type, data, ts, seq }) {
    this.lastEventAt = ts;
    if (type === "run.started") {
      this.status = "running";
      this.startedAt = this.startedAt ?? ts;
    } else if (type === "run.resumed") {
      // Another executor took the run over: it goes on where it was (the
      // message that was streaming continues), waiting if a question is open.
      this.status = openInputs(this.snapshot).length > 0 ? "waiting" : "running";
      const attempt = get(data, "attempt");
      this.attempt = typeof attempt === "number" ? attempt : this.attempt + 1;
      this.resumedAt = ts;
    } else if (type === "input.requested") {
      if (this.status === "running") {
        this.status = "waiting";
        this.waitingSince = ts;
      }
    } else if (type === "input.resolved") {
      if (this.status === "waiting" && openInputs(this.snapshot).length === 0) {
        this.status = "running";
        this.waitingSince = null;
      }
    } else if (type === "run.cancel_requested") {
      this.status = "cancelling";
      this.cancel = { requested_at: ts, reason: get(data, "reason"), stage: null };
    } else if (type === "run.succeeded") {
      this.status = "succeeded";
      this.output = get(data, "output");
    } else if (type === "run.failed") {
      this.status = "failed";
      this.error = get(data, "error");
    } else if (type === "run.cancelled") {
      this.status = "cancelled";
      const requestedAt = this.cancel ? this.cancel.requested_at : ts;
      this.cancel = { requested_at: requestedAt, reason: get(data, "reason"), stage: get(data, "stage") };
    } else if (type === "run.interrupted") {
      this.status = "interrupted";
      this.interruptReason = get(data, "reason");
    } else if (!KNOWN_TYPES.has(type)) {
      this.unknown.push({ seq, type, data });
      if (this.unknown.length > MAX_UNKNOWN_EVENTS) this.unknown.shift();
    }
    if (isTerminal(this.status)) this.finishedAt = this.finishedAt ?? ts;
  }

  /**
   * @param {string} problem
   * @returns {"protocol_error"}
   */
  _refuse(problem) {
    this.problem = problem;
    return "protocol_error";
  }
}
