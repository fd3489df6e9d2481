// The browser side of jupyter_agentruns: one anywidget module, no build step.
//
// Reading order follows the data: the reducer (events -> snapshot, the twin of
// jupyter_agentruns/reducer.py), the client reducer that guards it (RunState),
// the SSE parser, the page's one shared stream (Hub), the HTTP helpers, and
// last the view. anywidget loads this file as a single string, so nothing here
// may be imported from elsewhere, and the module must load without a DOM (Node
// tests import it): `document` and `window` are only touched at run time.

// ---------------------------------------------------------------------------
// The event semantics: a run's events reduced to its snapshot.

/** Terminal event types and the run status each one ends in. */
export const TERMINAL_TYPES = {
  "run.succeeded": "succeeded",
  "run.failed": "failed",
  "run.cancelled": "cancelled",
  "run.interrupted": "interrupted",
};

const TERMINAL_STATUSES = new Set(Object.values(TERMINAL_TYPES));
const ACTIVE_STATUSES = new Set(["queued", "running", "cancelling"]);

/** True when `status` is one of the four terminal statuses. */
export function isTerminal(status) {
  return TERMINAL_STATUSES.has(status);
}

/** The snapshot of a run with no events. */
export function emptySnapshot() {
  return { messages: [], tools: [], progress: null, usage: null };
}

const hasOwn = (object, key) => Object.prototype.hasOwnProperty.call(object, key);

function isPlainObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

// Python's dict.get(key, fallback), so that absent and null stay as distinct as there.
function get(data, key, fallback = null) {
  return hasOwn(data, key) ? data[key] : fallback;
}

// Python's data[key]: a missing key is an error, never a silent undefined.
function need(data, key, type) {
  if (!isPlainObject(data) || !hasOwn(data, key)) {
    throw new TypeError(`a ${type} event without ${key}`);
  }
  return data[key];
}

// Python truthiness of a JSON value: the reducer's `data or {}` and `if not ok`.
function truthy(value) {
  if (Array.isArray(value)) return value.length > 0;
  if (isPlainObject(value)) return Object.keys(value).length > 0;
  return Boolean(value);
}

function findLast(items, key, value) {
  // Searching from the end: events almost always concern the newest item.
  for (let i = items.length - 1; i >= 0; i--) {
    if (items[i][key] === value) return items[i];
  }
  return null;
}

/**
 * Apply one event to `snapshot` in place and return it.
 *
 * Unknown event types (`x.*` and future ones) leave the snapshot as it is.
 */
export function applyEvent(snapshot, event) {
  const type = event.type;
  const data = truthy(event.data) ? event.data : {};
  if (type === "message.started") {
    const id = need(data, "message_id", type);
    snapshot.messages.push({ id, role: get(data, "role", "assistant"), text: "", done: false });
  } else if (type === "text.delta") {
    const id = need(data, "message_id", type);
    const delta = need(data, "delta", type);
    if (typeof delta !== "string") throw new TypeError("a text.delta whose delta is not text");
    let message = findLast(snapshot.messages, "id", id);
    if (message === null) {
      // A delta without message.started still carries text worth showing.
      message = { id, role: "assistant", text: "", done: false };
      snapshot.messages.push(message);
    }
    message.text += delta;
  } else if (type === "message.completed") {
    const message = findLast(snapshot.messages, "id", need(data, "message_id", type));
    if (message !== null) message.done = true;
  } else if (type === "tool.started") {
    snapshot.tools.push({
      call_id: need(data, "call_id", type),
      name: need(data, "name", type),
      args: get(data, "args", {}),
      status: "running",
      result: null,
    });
  } else if (type === "tool.completed") {
    const tool = findLast(snapshot.tools, "call_id", need(data, "call_id", type));
    if (tool !== null) {
      const ok = truthy(get(data, "ok", true));
      tool.status = ok ? "completed" : "failed";
      tool.result = get(data, "result");
      if (!ok) tool.error = get(data, "error");
    }
  } else if (type === "progress") {
    snapshot.progress = { fraction: get(data, "fraction"), message: get(data, "message") };
  } else if (type === "usage") {
    snapshot.usage = {
      input_tokens: get(data, "input_tokens"),
      output_tokens: get(data, "output_tokens"),
    };
  }
  return snapshot;
}

/** Reduce `events` onto a copy of `snapshot` (or an empty one). */
export function reduceEvents(events, snapshot = null) {
  const result = snapshot === null ? emptySnapshot() : structuredClone(snapshot);
  for (const event of events) applyEvent(result, event);
  return result;
}

// ---------------------------------------------------------------------------
// The client reducer: one view's state of one run, guarded against bad input.

/** One text.delta larger than this is a protocol error, not text to render. */
export const MAX_DELTA_BYTES = 64 * 1024;
/** A run whose text grows beyond this is a protocol error. */
export const MAX_TEXT_BYTES = 8 * 1024 * 1024;
/** How many unknown events a view keeps to show generically. */
export const MAX_UNKNOWN_EVENTS = 20;

// The reducer's own types plus the lifecycle ones: all others are "unknown".
const KNOWN_TYPES = new Set([
  "run.started",
  "run.cancel_requested",
  "message.started",
  "text.delta",
  "message.completed",
  "tool.started",
  "tool.completed",
  "progress",
  "usage",
  ...Object.keys(TERMINAL_TYPES),
]);

// The data fields without which a known event cannot be applied.
const REQUIRED_TEXT_FIELDS = {
  "message.started": ["message_id"],
  "text.delta": ["message_id", "delta"],
  "message.completed": ["message_id"],
  "tool.started": ["call_id", "name"],
  "tool.completed": ["call_id"],
};

/** The UTF-8 size of a string, without allocating its bytes. */
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

function isSeq(value) {
  return Number.isSafeInteger(value) && value >= 0;
}

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
 * One view's state of one run: the snapshot at `lastSeq` and the run's status.
 *
 * Events go through `applyEnvelope`, which de-duplicates by seq, reports holes,
 * and refuses malformed or absurdly large input instead of rendering it.
 */
export class RunState {
  constructor(runId) {
    this.runId = runId;
    this.run = null;
    this.snapshot = emptySnapshot();
    this.lastSeq = 0;
    this.status = "queued";
    this.output = null;
    this.error = null;
    this.cancel = null;
    this.interruptReason = null;
    this.unknown = [];
    this.problem = null;
    this.textBytes = 0;
  }

  get terminal() {
    return isTerminal(this.status);
  }

  /** Take the state from a run object (`GET runs/{id}` or a snapshot frame): "loaded" | "protocol_error". */
  loadRun(run) {
    const problem = runProblem(run, this.runId);
    if (problem !== null) return this._refuse(problem);
    const textBytes = run.snapshot.messages.reduce((sum, message) => sum + utf8Length(message.text), 0);
    if (textBytes > MAX_TEXT_BYTES) return this._refuse(`the run's text is over ${MAX_TEXT_BYTES} bytes`);
    this.run = run;
    this.snapshot = structuredClone(run.snapshot);
    this.lastSeq = run.last_seq;
    this.status = run.status;
    this.output = run.output ?? null;
    this.error = run.error ?? null;
    this.cancel = run.cancel ?? null;
    this.interruptReason = null;
    this.unknown = [];
    this.problem = null;
    this.textBytes = textBytes;
    return "loaded";
  }

  /** Apply one event envelope: "applied" | "duplicate" | "gap" | "protocol_error". */
  applyEnvelope(envelope) {
    if (this.problem !== null) return "protocol_error";
    const problem = envelopeProblem(envelope, this.runId);
    if (problem !== null) return this._refuse(problem);
    if (envelope.seq <= this.lastSeq) return "duplicate";
    // A hole means events were lost: only rereading the run can repair it.
    if (envelope.seq > this.lastSeq + 1) return "gap";
    let deltaBytes = 0;
    if (envelope.type === "text.delta") {
      deltaBytes = utf8Length(envelope.data.delta);
      if (deltaBytes > MAX_DELTA_BYTES) {
        return this._refuse(`event ${envelope.seq} carries a text.delta of ${deltaBytes} bytes (limit ${MAX_DELTA_BYTES})`);
      }
      if (this.textBytes + deltaBytes > MAX_TEXT_BYTES) {
        return this._refuse(`the run's text grew over ${MAX_TEXT_BYTES} bytes`);
      }
    }
    applyEvent(this.snapshot, envelope);
    this.textBytes += deltaBytes;
    this.lastSeq = envelope.seq;
    this._record(envelope);
    return "applied";
  }

  // What the snapshot does not hold: the status and its details, and unknown events.
  _record({ type, data, ts, seq }) {
    if (type === "run.started") {
      this.status = "running";
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
  }

  _refuse(problem) {
    this.problem = problem;
    return "protocol_error";
  }
}

// ---------------------------------------------------------------------------
// Server-sent events, parsed incrementally as the WHATWG spec says.

const LINE_END = /\r\n|\r|\n/g;

/**
 * An incremental text/event-stream parser.
 *
 * `feed(chunk)` returns the frames completed by that chunk, each
 * `{event, data, id, retry}`: `data` is null for a frame that only set
 * `retry` (ms, else null); `id` is the last event id seen, else null.
 */
export class SSEParser {
  constructor() {
    this.pieces = []; // the line being received, in chunks
    this.started = false;
    this.skipLineFeed = false;
    this.lastEventId = null;
    this._resetFrame();
  }

  feed(chunk) {
    let text = chunk;
    if (!this.started && text.length > 0) {
      this.started = true;
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
    }
    // A chunk ending in "\r" may be half of a "\r\n" split across chunks.
    if (this.skipLineFeed && text.length > 0) {
      this.skipLineFeed = false;
      if (text[0] === "\n") text = text.slice(1);
    }
    const frames = [];
    let start = 0;
    let match;
    LINE_END.lastIndex = 0;
    while ((match = LINE_END.exec(text)) !== null) {
      if (match[0] === "\r" && match.index === text.length - 1) this.skipLineFeed = true;
      // Joining the pieces of a long line only once keeps a big frame linear in its size.
      const piece = text.slice(start, match.index);
      const line = this.pieces.length === 0 ? piece : this.pieces.join("") + piece;
      this.pieces = [];
      this._line(line, frames);
      start = LINE_END.lastIndex;
    }
    if (start < text.length) this.pieces.push(text.slice(start));
    return frames;
  }

  _line(line, frames) {
    if (line === "") {
      this._dispatch(frames);
      return;
    }
    if (line[0] === ":") return; // a comment, e.g. ": ping"
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value[0] === " ") value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.event = value;
    else if (field === "id" && !value.includes("\0")) this.lastEventId = value;
    else if (field === "retry" && /^\d+$/.test(value)) this.retry = Number(value);
  }

  _dispatch(frames) {
    if (this.data.length > 0 || this.retry !== null) {
      frames.push({
        event: this.event || "message",
        data: this.data.length > 0 ? this.data.join("\n") : null,
        id: this.lastEventId,
        retry: this.retry,
      });
    }
    this._resetFrame();
  }

  _resetFrame() {
    this.event = "";
    this.data = [];
    this.retry = null;
  }
}

// ---------------------------------------------------------------------------
// Reconnecting politely.

/** The server's `retry:` before it has sent one, in ms. */
export const DEFAULT_RETRY_MS = 1000;
/** The longest wait between two reconnects, in ms. */
export const MAX_BACKOFF_MS = 30000;
/** How often a signed-out page tries again, in ms. */
export const SIGNED_OUT_RETRY_MS = 30000;

/**
 * The wait before reconnect number `attempt` (1, 2, ...): exponential, capped,
 * with full jitter above the floor, so a restarted server is not stampeded.
 */
export function backoffDelay(attempt, floorMs, random) {
  const ceiling = Math.max(floorMs, Math.min(MAX_BACKOFF_MS, floorMs * 2 ** attempt));
  return Math.round(floorMs + random() * (ceiling - floorMs));
}

// ---------------------------------------------------------------------------
// One stream for the whole page.

const HUB_KEY = "__jupyterAgentrunsHub";
/** The streams endpoint carries at most this many runs per connection. */
export const MAX_RUNS_PER_STREAM = 50;
const REOPEN_DEBOUNCE_MS = 50;

/**
 * The page's one connection to `GET streams`, shared by every view.
 *
 * It keeps a cursor per run, delivers each event once to each listener, and
 * reconnects with backoff. Several copies of this module may share one hub
 * (see getHub), so it deals with listeners by duck typing only.
 */
export class Hub {
  constructor(options = {}) {
    this.baseUrl = withSlash(options.baseUrl || "/");
    this.fetch = options.fetch || ((url, init) => globalThis.fetch(url, init));
    this.setTimeout = options.setTimeout || ((fn, ms) => globalThis.setTimeout(fn, ms));
    this.clearTimeout = options.clearTimeout || ((id) => globalThis.clearTimeout(id));
    this.random = options.random || Math.random;
    this.runs = new Map(); // run_id -> {runId, cursor, registrations: Set<{listener, cursor}>}
    this.connection = null;
    this.state = "idle";
    this.retryFloorMs = DEFAULT_RETRY_MS;
    this.attempt = 0;
    this.reopenTimer = null;
    this.retryTimer = null;
  }

  /**
   * Follow `runId` from `cursor` (the seq of the last event the listener has).
   *
   * `listener` may have onEvent(envelope), onSnapshot(run), onError({run_id, error})
   * and onConnection(state). Returns the function that stops following.
   */
  register(runId, cursor, listener) {
    let entry = this.runs.get(runId);
    if (entry === undefined) {
      entry = { runId, cursor, registrations: new Set() };
      this.runs.set(runId, entry);
      this._changed();
    } else if (cursor < entry.cursor) {
      // A newcomer needs events the stream has passed: rewind for everyone.
      entry.cursor = cursor;
      this._changed();
    }
    const registration = { listener, cursor };
    entry.registrations.add(registration);
    return () => this._unregister(entry, registration);
  }

  _unregister(entry, registration) {
    if (!entry.registrations.delete(registration)) return;
    if (entry.registrations.size === 0 && this.runs.get(entry.runId) === entry) {
      this.runs.delete(entry.runId);
      this._changed();
    }
  }

  // Batch registrations (a notebook renders many widgets at once) into one reopen.
  _changed() {
    if (this.reopenTimer !== null) this.clearTimeout(this.reopenTimer);
    this.reopenTimer = this.setTimeout(() => {
      this.reopenTimer = null;
      this._reopen();
    }, REOPEN_DEBOUNCE_MS);
  }

  _reopen() {
    if (this.retryTimer !== null) {
      this.clearTimeout(this.retryTimer);
      this.retryTimer = null;
    }
    const runs = this._streamedRuns();
    if (this._carries(runs)) return;
    this._close();
    if (runs.length === 0) {
      this.state = "idle";
      return;
    }
    this._connect(runs);
  }

  _streamedRuns() {
    return [...this.runs.values()].slice(0, MAX_RUNS_PER_STREAM);
  }

  // The open connection already streams exactly these runs, none of them behind it.
  _carries(runs) {
    const connection = this.connection;
    if (connection === null || connection.runIds.size !== runs.length) return false;
    return runs.every(
      (entry) => connection.runIds.has(entry.runId) && entry.cursor >= connection.positions.get(entry.runId)
    );
  }

  _close() {
    const connection = this.connection;
    if (connection === null) return;
    this.connection = null;
    connection.controller.abort();
    if (connection.reader !== null) connection.reader.cancel().catch(() => {});
  }

  async _connect(runs) {
    const connection = {
      controller: new AbortController(),
      reader: null,
      runIds: new Set(runs.map((entry) => entry.runId)),
      positions: new Map(runs.map((entry) => [entry.runId, entry.cursor])),
    };
    this.connection = connection;
    const list = runs.map((entry) => `${encodeURIComponent(entry.runId)}:${entry.cursor}`).join(",");
    let response;
    try {
      response = await this.fetch(`${this.baseUrl}api/agentruns/streams?runs=${list}`, {
        credentials: "same-origin",
        headers: { Accept: "text/event-stream" },
        signal: connection.controller.signal,
      });
    } catch {
      if (this.connection !== connection) return; // aborted by a reopen
      this.connection = null;
      this._lost();
      return;
    }
    if (this.connection !== connection) return;
    if (response.status === 401 || response.status === 403) {
      // The login expired: say so, and look again now and then in case it comes back.
      this.connection = null;
      this._announce("signed_out");
      this.retryTimer = this.setTimeout(() => this._retry(), SIGNED_OUT_RETRY_MS);
      return;
    }
    if (!response.ok) {
      this.connection = null;
      this._lost();
      return;
    }
    if (response.status === 204) {
      await this._ended(connection); // every run listed had already ended at its cursor
      return;
    }
    if (!response.body || typeof response.body.getReader !== "function") {
      this.connection = null;
      this._announce("failed");
      return;
    }
    this.attempt = 0;
    this._announce("connected");
    connection.reader = response.body.getReader();
    await this._read(connection);
  }

  async _read(connection) {
    const decoder = new TextDecoder();
    const parser = new SSEParser();
    try {
      for (;;) {
        const { value, done } = await connection.reader.read();
        if (this.connection !== connection) return;
        if (done) break;
        for (const frame of parser.feed(decoder.decode(value, { stream: true }))) {
          this._dispatch(frame, connection);
          if (this.connection !== connection) return;
        }
      }
    } catch {
      if (this.connection !== connection) return;
      this.connection = null;
      this._lost();
      return;
    }
    await this._ended(connection);
  }

  // The server ends a stream only once each of its runs ended. A run whose end
  // did not come through is read: a lost final event is repaired from the run.
  async _ended(connection) {
    this.connection = null;
    const unfinished = [...connection.runIds].filter((runId) => this.runs.has(runId));
    await Promise.all(unfinished.map((runId) => this._readRun(runId)));
    if (this.connection !== null || this.reopenTimer !== null || this.retryTimer !== null) return;
    if (this.runs.size > 0) this._lost();
    else this.state = "idle";
  }

  async _readRun(runId) {
    try {
      const response = await this.fetch(`${this.baseUrl}api/agentruns/runs/${encodeURIComponent(runId)}`, {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
      const body = await response.json();
      const entry = this.runs.get(runId);
      if (entry === undefined) return;
      if (response.ok) this._snapshot(entry, body, null);
      else if (response.status === 404 || response.status === 410) this._error(entry, { run_id: runId, error: body });
    } catch {
      // Unreadable now: the reconnect that follows will try again.
    }
  }

  _dispatch(frame, connection) {
    if (frame.retry !== null) this.retryFloorMs = frame.retry;
    if (frame.data === null) return;
    let data;
    try {
      data = JSON.parse(frame.data);
    } catch {
      console.warn("agentruns: skipped a frame that is not JSON", frame.event);
      return;
    }
    const entry = isPlainObject(data) ? this.runs.get(data.run_id) : undefined;
    if (entry === undefined) return; // a run nobody follows any more
    if (frame.event === "snapshot") this._snapshot(entry, data, connection);
    else if (frame.event === "error") this._error(entry, data);
    else this._event(entry, data, connection);
  }

  _event(entry, envelope, connection) {
    if (!isSeq(envelope.seq)) {
      // Let the views see it: to them it is a protocol error to show.
      for (const { listener } of entry.registrations) call(listener, "onEvent", envelope);
      return;
    }
    entry.cursor = Math.max(entry.cursor, envelope.seq);
    connection.positions.set(entry.runId, entry.cursor);
    if (hasOwn(TERMINAL_TYPES, envelope.type)) this._finish(entry);
    for (const registration of entry.registrations) {
      if (envelope.seq <= registration.cursor) continue; // this listener has it already
      registration.cursor = envelope.seq;
      call(registration.listener, "onEvent", envelope);
    }
  }

  _snapshot(entry, run, connection) {
    if (!isPlainObject(run) || !isSeq(run.last_seq)) return;
    entry.cursor = run.last_seq;
    if (connection !== null) connection.positions.set(entry.runId, run.last_seq);
    // The snapshot of a finished run already holds its terminal event.
    if (isTerminal(run.status)) this._finish(entry);
    for (const registration of entry.registrations) {
      registration.cursor = run.last_seq;
      call(registration.listener, "onSnapshot", run);
    }
  }

  _error(entry, data) {
    this._finish(entry);
    for (const { listener } of entry.registrations) call(listener, "onError", data);
  }

  // A finished run leaves the next connection; runs waiting for a slot may take it.
  // Finishing comes before telling the listeners, so that their unregistering
  // (a view stops following a finished run) does not count as a change.
  _finish(entry) {
    if (this.runs.get(entry.runId) !== entry) return;
    this.runs.delete(entry.runId);
    // The server stops streaming a finished run too: the connection no longer carries it.
    if (this.connection !== null) this.connection.runIds.delete(entry.runId);
    if (this.runs.size >= MAX_RUNS_PER_STREAM) this._changed();
  }

  _lost() {
    this.attempt += 1;
    this._announce("reconnecting");
    const delay = backoffDelay(this.attempt, this.retryFloorMs, this.random);
    this.retryTimer = this.setTimeout(() => this._retry(), delay);
  }

  _retry() {
    this.retryTimer = null;
    this._reopen();
  }

  _announce(state) {
    this.state = state;
    for (const entry of [...this.runs.values()]) {
      for (const { listener } of [...entry.registrations]) call(listener, "onConnection", state);
    }
  }
}

// One listener's mistake must not stop the stream for the others.
function call(listener, method, argument) {
  if (typeof listener[method] !== "function") return;
  try {
    listener[method](argument);
  } catch (error) {
    console.error(`agentruns: a listener's ${method} failed`, error);
  }
}

/**
 * The page's hub, created on first use with `options`.
 *
 * Each widget may load its own copy of this module, so the hub lives on globalThis.
 */
export function getHub(options = {}) {
  if (!globalThis[HUB_KEY]) globalThis[HUB_KEY] = new Hub(options);
  return globalThis[HUB_KEY];
}

// ---------------------------------------------------------------------------
// Talking to the server from the page: same origin, cookie auth.

function withSlash(url) {
  return url.endsWith("/") ? url : `${url}/`;
}

function pageBaseUrl() {
  if (typeof document === "undefined") return null;
  const config = document.getElementById("jupyter-config-data");
  if (!config) return null;
  try {
    return JSON.parse(config.textContent).baseUrl || null;
  } catch {
    return null;
  }
}

/** The server's base URL path: the page's config, else the model's `base_url`, else "/". */
export function apiBase(model) {
  const fromModel = model && typeof model.get === "function" ? model.get("base_url") : null;
  return withSlash(pageBaseUrl() || fromModel || "/");
}

/** The `_xsrf` cookie that tornado wants back in `X-XSRFToken`, or null. */
export function xsrfToken() {
  if (typeof document === "undefined") return null;
  const match = document.cookie.match(/(?:^|;\s*)_xsrf=([^;]*)/);
  return match ? match[1] : null;
}

const SAFE_METHODS = new Set(["GET", "HEAD", "OPTIONS"]);

/** fetch() with cookie auth, JSON bodies, and the XSRF header on writes. */
export function apiFetch(path, options = {}) {
  const method = (options.method || "GET").toUpperCase();
  const headers = { Accept: "application/json", ...options.headers };
  let body = options.body;
  if (body !== undefined && typeof body !== "string") {
    body = JSON.stringify(body);
    headers["Content-Type"] = "application/json";
  }
  if (!SAFE_METHODS.has(method)) {
    const token = xsrfToken();
    if (token !== null) headers["X-XSRFToken"] = token;
  }
  return fetch(path, { ...options, method, headers, body, credentials: "same-origin" });
}

function newIdempotencyKey() {
  // getRandomValues works on plain-http servers too, where randomUUID does not exist.
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    if (body && body.message) return body.message;
  } catch {
    // Not our JSON: fall back to the status line.
  }
  return `the server answered ${response.status}`;
}

// ---------------------------------------------------------------------------
// The view.

const SAVE_INTERVAL_MS = 500;
const LOAD_RETRY_FLOOR_MS = 1000;

/**
 * Writes `last_seq` and `status` back to the kernel for one model: at most
 * about twice a second, at once when the status changes.
 */
class ModelSync {
  constructor(model) {
    this.model = model;
    this.pending = null;
    this.timer = null;
  }

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

const syncs = new WeakMap();

function syncFor(model) {
  if (!syncs.has(model)) syncs.set(model, new ModelSync(model));
  return syncs.get(model);
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function compactJson(value, limit) {
  let text;
  try {
    text = JSON.stringify(value);
  } catch {
    text = String(value);
  }
  if (text === undefined) text = String(value);
  return text.length > limit ? `${text.slice(0, limit - 1)}…` : text;
}

// What the chip says for a problem of the view (not a status of the run).
const PROBLEMS = {
  not_found: "run not found",
  expired: "expired",
  signed_out: "signed out",
  unreachable: "reconnecting",
  protocol_error: "protocol error",
  error: "error",
};

/** One view of a run: renders its snapshot, then follows it through the hub. */
class RunView {
  constructor(model, el) {
    this.model = model;
    this.sync = syncFor(model);
    this.root = element("div", "agentruns-run");
    this._buildHeader();
    this.notice = element("div", "agentruns-notice");
    this.body = element("div", "agentruns-body");
    this.root.append(this.header, this.notice, this.body);
    el.appendChild(this.root);
    this.attachment = 0;
    this.state = null;
    this.problem = null; // {kind, message}
    this.connection = "connected";
    this.unregister = null;
    this.loadTimer = null;
    this.frame = null;
    this.busy = false;
    this.retryKey = null;
    this.loadAttempt = 0;
    this.rendered = null;
  }

  _buildHeader() {
    this.header = element("div", "agentruns-header");
    this.agent = element("span", "agentruns-agent");
    this.chip = element("span", "agentruns-chip");
    this.detail = element("span", "agentruns-detail");
    this.cancelButton = element("button", "agentruns-button agentruns-cancel", "Cancel");
    this.againButton = element("button", "agentruns-button agentruns-again", "Run again");
    this.cancelButton.type = "button";
    this.againButton.type = "button";
    this.cancelButton.addEventListener("click", () => this._cancel());
    this.againButton.addEventListener("click", () => this._runAgain());
    const spacer = element("span", "agentruns-spacer");
    this.header.append(this.agent, this.chip, this.detail, spacer, this.cancelButton, this.againButton);
  }

  get api() {
    return `${apiBase(this.model)}api/agentruns/`;
  }

  /** Show and follow `runId`, leaving whatever run this view showed before. */
  attach(runId) {
    this._stopFollowing();
    this.attachment += 1;
    this.state = runId ? new RunState(runId) : null;
    this.problem = null;
    this.connection = "connected";
    this.retryKey = null;
    this.loadAttempt = 0;
    this._changed();
    if (this.state !== null) this._load(this.attachment);
  }

  dispose() {
    this.attachment += 1;
    this._stopFollowing();
    if (this.frame !== null) cancelFrame(this.frame);
    this.frame = null;
  }

  // Read the run (its snapshot at last_seq), then follow its events from there.
  async _load(attachment) {
    const state = this.state;
    let response;
    try {
      response = await apiFetch(`${this.api}runs/${encodeURIComponent(state.runId)}`);
    } catch {
      if (attachment === this.attachment) this._retryLoad(attachment, "unreachable", "Cannot reach the server; retrying.");
      return;
    }
    if (attachment !== this.attachment) return;
    if (response.status === 404) return this._fail("not_found", `Run ${state.runId} does not exist, or is not yours.`);
    if (response.status === 410) return this._fail("expired", "The server no longer keeps this run (retention).");
    if (response.status === 401 || response.status === 403) {
      return this._retryLoad(attachment, "signed_out", "Sign in to Jupyter again; this view retries every 30 s.", SIGNED_OUT_RETRY_MS);
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
    if (state.loadRun(run) === "protocol_error") return this._fail("protocol_error", state.problem);
    this._show();
    if (!state.terminal) this._follow();
  }

  _retryLoad(attachment, kind, message, delay) {
    this.problem = { kind, message };
    this._changed();
    this.loadAttempt += 1;
    const wait = delay || backoffDelay(this.loadAttempt, LOAD_RETRY_FLOOR_MS, Math.random);
    this.loadTimer = setTimeout(() => {
      this.loadTimer = null;
      if (attachment === this.attachment) this._load(attachment);
    }, wait);
  }

  // Draw the state soon, and tell the kernel where the run is.
  _show() {
    const state = this.state;
    this._changed();
    this.sync.save(state.runId, state.lastSeq, state.status, state.terminal);
  }

  _follow() {
    const attachment = this.attachment;
    const state = this.state;
    const current = (handler) => (value) => {
      if (attachment === this.attachment && this.state === state) handler(value);
    };
    const hub = getHub({ baseUrl: apiBase(this.model) });
    this.unregister = hub.register(state.runId, state.lastSeq, {
      onEvent: current((envelope) => this._event(envelope)),
      onSnapshot: current((run) => this._snapshot(run)),
      onError: current((frame) => this._streamError(frame)),
      onConnection: current((connection) => {
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
  _snapshot(run) {
    const state = this.state;
    if (state.loadRun(run) === "protocol_error") return this._fail("protocol_error", state.problem);
    this._show();
    if (state.terminal) this._stopFollowing();
  }

  _event(envelope) {
    const state = this.state;
    const result = state.applyEnvelope(envelope);
    if (result === "applied") {
      this._show();
      if (state.terminal) this._stopFollowing();
    } else if (result === "gap") {
      this._resync();
    } else if (result === "protocol_error") {
      this._fail("protocol_error", state.problem);
    }
  }

  // Events were lost, or the cursor is off: the run itself is the authority.
  _resync() {
    this._stopFollowing();
    this._load(this.attachment);
  }

  _streamError({ error }) {
    const code = error && error.error;
    const message = (error && error.message) || "The server stopped streaming this run.";
    if (code === "run_not_found") this._fail("not_found", message);
    else if (code === "run_expired") this._fail("expired", message);
    else if (code === "cursor_ahead") this._resync(); // the server's answer says what to do
    else this._fail("error", message);
  }

  _fail(kind, message) {
    this._stopFollowing();
    this.problem = { kind, message };
    this._changed();
  }

  async _cancel() {
    const state = this.state;
    if (state === null || this.busy) return;
    this.busy = true;
    this._changed();
    try {
      const response = await apiFetch(`${this.api}runs/${encodeURIComponent(state.runId)}/cancel`, {
        method: "POST",
        body: { reason: "cancelled from the notebook" },
      });
      if (!response.ok) this._say(`Cancel failed: ${await errorMessage(response)}`);
    } catch {
      this._say("Cancel failed: cannot reach the server.");
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
    // The same key until the server answers: a network retry must not start two runs.
    this.retryKey = this.retryKey || newIdempotencyKey();
    try {
      const old = await apiFetch(`${this.api}runs/${encodeURIComponent(state.runId)}`);
      if (!old.ok) return this._say(`Run again failed: ${await errorMessage(old)}`);
      const { agent, input, session, metadata } = await old.json();
      const response = await apiFetch(`${this.api}runs`, {
        method: "POST",
        headers: { "Idempotency-Key": this.retryKey },
        body: { agent, input, session, metadata, retry_of: state.runId },
      });
      this.retryKey = null;
      if (!response.ok) return this._say(`Run again failed: ${await errorMessage(response)}`);
      const run = await response.json();
      // The model's change:run_id re-attaches every view of it, this one included.
      this.model.set("run_id", run.run_id);
      this.model.set("last_seq", 0);
      this.model.set("status", run.status);
      this.model.save_changes();
    } catch {
      this._say("Run again failed: cannot reach the server.");
    } finally {
      this.busy = false;
      this._changed();
    }
  }

  // A passing message that does not change what the view follows.
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
    const status = state && state.run ? state.status : this.model.get("status") || "";
    this.root.dataset.runId = state ? state.runId : "";
    this.root.dataset.status = status;
    this.root.dataset.lastSeq = String(state && state.run ? state.lastSeq : this.model.get("last_seq") || 0);
    this._renderHeader(status);
    if (state === null || state.run === null) {
      this.body.replaceChildren();
      this.rendered = null;
      return;
    }
    if (this.rendered === null || this.rendered.snapshot !== state.snapshot) this._resetBody(state);
    this._renderTools(state.snapshot.tools);
    this._renderProgress(state.snapshot.progress);
    this._renderMessages(state.snapshot.messages, state.textBytes > 0);
    this._renderUsage(state.snapshot.usage);
    this._renderOutput(state);
    this._renderUnknown(state.unknown);
  }

  _renderHeader(status) {
    const state = this.state;
    const active = ACTIVE_STATUSES.has(status);
    this.agent.textContent = state && state.run ? state.run.agent : "agent run";
    this.agent.title = state ? state.runId : "";
    let chip = status || "loading";
    let kind = status || "queued";
    let detail = "";
    if (this.problem !== null && this.problem.kind !== "note") {
      chip = PROBLEMS[this.problem.kind];
      kind = this.problem.kind;
    } else if (active && this.connection !== "connected" && this.unregister !== null) {
      chip = { reconnecting: "reconnecting", signed_out: "signed out", failed: "connection failed" }[this.connection];
      kind = this.connection;
    } else if (state && status === "failed" && state.error) {
      detail = `${state.error.type}: ${state.error.message}`;
    } else if (state && status === "cancelled" && state.cancel && state.cancel.reason) {
      detail = state.cancel.reason;
    } else if (state && status === "interrupted" && state.interruptReason) {
      detail = state.interruptReason;
    }
    this.chip.textContent = chip;
    this.chip.dataset.kind = kind;
    this.detail.textContent = detail;
    this.notice.textContent = this.problem ? this.problem.message : "";
    this.notice.hidden = this.problem === null;
    const loaded = state !== null && state.run !== null && (this.problem === null || this.problem.kind === "note");
    this.cancelButton.hidden = !(loaded && active);
    this.cancelButton.disabled = this.busy || status === "cancelling";
    this.againButton.hidden = !(loaded && isTerminal(status));
    this.againButton.disabled = this.busy;
  }

  _resetBody(state) {
    this.tools = element("div", "agentruns-tools");
    this.progress = element("div", "agentruns-progress");
    this.progressBar = element("div", "agentruns-progress-bar");
    this.progressFill = element("div", "agentruns-progress-fill");
    this.progressMessage = element("span", "agentruns-progress-message");
    this.progressBar.appendChild(this.progressFill);
    this.progress.append(this.progressBar, this.progressMessage);
    this.messages = element("div", "agentruns-messages");
    this.usage = element("div", "agentruns-usage");
    this.output = element("div", "agentruns-output");
    this.unknown = element("div", "agentruns-unknown");
    this.body.replaceChildren(this.tools, this.progress, this.messages, this.usage, this.output, this.unknown);
    this.rendered = { snapshot: state.snapshot, tools: [], messages: [], progress: undefined, usage: undefined, unknown: null };
  }

  _renderTools(tools) {
    const cards = this.rendered.tools;
    tools.forEach((tool, index) => {
      const card = cards[index];
      if (card && card.tool === tool && card.status === tool.status) return;
      const node = toolCard(tool);
      if (card) card.node.replaceWith(node);
      else this.tools.appendChild(node);
      cards[index] = { tool, status: tool.status, node };
    });
    this.tools.hidden = tools.length === 0;
  }

  _renderProgress(progress) {
    if (this.rendered.progress === progress) return;
    this.rendered.progress = progress;
    this.progress.hidden = progress === null;
    if (progress === null) return;
    const known = typeof progress.fraction === "number";
    this.progress.classList.toggle("agentruns-progress--indeterminate", !known);
    const percent = known ? Math.round(Math.min(1, Math.max(0, progress.fraction)) * 100) : null;
    this.progressFill.style.width = known ? `${percent}%` : "";
    this.progressBar.title = known ? `${percent}%` : "working";
    this.progressMessage.textContent = progress.message || (known ? `${percent}%` : "");
  }

  _renderMessages(messages, hasText) {
    const shown = this.rendered.messages;
    // An empty box for a message that has not said anything yet is only noise.
    this.messages.hidden = !hasText;
    if (!hasText) return;
    const box = this.messages;
    // Follow the text only while the reader is at the bottom; never yank them back down.
    const atBottom = box.scrollTop + box.clientHeight >= box.scrollHeight - 8;
    messages.forEach((message, index) => {
      let entry = shown[index];
      if (!entry) {
        entry = messageEntry(message);
        box.appendChild(entry.node);
        shown[index] = entry;
      }
      if (message.text.length > entry.length) entry.text.appendData(message.text.slice(entry.length));
      entry.length = message.text.length;
      entry.node.classList.toggle("agentruns-message--done", message.done);
    });
    if (atBottom) box.scrollTop = box.scrollHeight;
  }

  _renderUsage(usage) {
    if (this.rendered.usage === usage) return;
    this.rendered.usage = usage;
    this.usage.hidden = usage === null;
    if (usage !== null) this.usage.textContent = `tokens: ${usage.input_tokens ?? "?"} in · ${usage.output_tokens ?? "?"} out`;
  }

  _renderOutput(state) {
    // Text the agent streamed already says it; show the output for agents that stream none.
    const show = state.status === "succeeded" && state.output !== null && state.snapshot.messages.length === 0;
    this.output.hidden = !show;
    if (show) this.output.textContent = `output: ${compactJson(state.output, 500)}`;
  }

  _renderUnknown(unknown) {
    const last = unknown[unknown.length - 1];
    if (this.rendered.unknown === last) return;
    this.rendered.unknown = last;
    this.unknown.replaceChildren(
      ...unknown.map((event) => element("div", "agentruns-event", `${event.type}: ${compactJson(event.data, 200)}`))
    );
    this.unknown.hidden = unknown.length === 0;
  }
}

function toolCard(tool) {
  const card = element("div", `agentruns-tool agentruns-tool--${tool.status}`);
  const head = element("div", "agentruns-tool-head");
  head.append(
    element("span", "agentruns-tool-name", String(tool.name)),
    element("span", "agentruns-tool-args", compactJson(tool.args, 80)),
    element("span", "agentruns-tool-status", tool.status)
  );
  card.appendChild(head);
  if (tool.status === "failed") {
    const error = tool.error;
    const text = error && error.message ? `${error.type || "error"}: ${error.message}` : compactJson(error, 160);
    card.appendChild(element("div", "agentruns-tool-result", text));
  } else if (tool.status === "completed" && tool.result !== null && tool.result !== undefined) {
    card.appendChild(element("div", "agentruns-tool-result", compactJson(tool.result, 160)));
  }
  return card;
}

function messageEntry(message) {
  const node = element("div", "agentruns-message");
  node.dataset.role = message.role || "assistant";
  if (message.role && message.role !== "assistant") node.appendChild(element("div", "agentruns-role", message.role));
  const text = document.createTextNode("");
  node.appendChild(text);
  return { node, text, length: 0 };
}

function requestFrame(callback) {
  if (typeof requestAnimationFrame === "function") return requestAnimationFrame(callback);
  return setTimeout(callback, 16);
}

function cancelFrame(handle) {
  if (typeof cancelAnimationFrame === "function") cancelAnimationFrame(handle);
  else clearTimeout(handle);
}

// ---------------------------------------------------------------------------
// anywidget entry points.

export default {
  initialize({ model }) {
    const sync = syncFor(model);
    return () => sync.dispose();
  },

  render({ model, el }) {
    const view = new RunView(model, el);
    const onRunChanged = () => view.attach(model.get("run_id"));
    model.on("change:run_id", onRunChanged);
    view.attach(model.get("run_id"));
    return () => {
      model.off("change:run_id", onRunChanged);
      view.dispose();
    };
  },
};
