// One stream for the whole page.

import { DEFAULT_RETRY_MS, SIGNED_OUT_RETRY_MS, backoffDelay } from "./backoff.js";
import { apiFetch, withSlash } from "./api.js";
import { isPlainObject, isSeq } from "./json.js";
import { SSEParser } from "./sse.js";
import { isTerminal, isTerminalType } from "./status.js";

/**
 * What a view hands the hub: any of these may be absent.
 * @typedef {{
 *   onEvent?: (envelope: any) => void,
 *   onSnapshot?: (run: any) => void,
 *   onError?: (frame: {run_id: string, error: any}) => void,
 *   onConnection?: (state: ConnectionState) => void,
 * }} Listener
 * @typedef {"idle" | "connected" | "reconnecting" | "signed_out" | "failed"} ConnectionState
 * @typedef {{listener: Listener, cursor: number}} Registration
 * @typedef {{runId: string, cursor: number, registrations: Set<Registration>}} Entry
 * @typedef {{
 *   controller: AbortController,
 *   reader: ReadableStreamDefaultReader<Uint8Array> | null,
 *   runIds: Set<string>,
 *   positions: Map<string, number>,
 * }} Connection
 * @typedef {{
 *   baseUrl?: string,
 *   fetch?: import("./api.js").Fetch,
 *   setTimeout?: (fn: () => void, ms: number) => any,
 *   clearTimeout?: (id: any) => void,
 *   random?: () => number,
 * }} StreamHubOptions
 */

// Copies of this module, of this version or another, find the page's hub by this name.
const STREAM_HUB_KEY = "__jupyterAgentrunsHub";
/** The streams endpoint carries at most this many runs per connection. */
export const MAX_RUNS_PER_STREAM = 50;
const REOPEN_DEBOUNCE_MS = 50;

/**
 * The page's one connection to `GET streams`, shared by every view.
 *
 * It keeps a cursor per run, delivers each event once to each listener, and
 * reconnects with backoff. Several copies of this module may share one hub
 * (see getStreamHub), so it deals with listeners by duck typing only.
 */
export class StreamHub {
  /** @param {StreamHubOptions} [options] */
  constructor(options = {}) {
    this.baseUrl = withSlash(options.baseUrl || "/");
    this.fetch = options.fetch || apiFetch;
    this.setTimeout = options.setTimeout || ((/** @type {() => void} */ fn, /** @type {number} */ ms) => globalThis.setTimeout(fn, ms));
    this.clearTimeout = options.clearTimeout || ((/** @type {any} */ id) => globalThis.clearTimeout(id));
    this.random = options.random || Math.random;
    /** @type {Map<string, Entry>} */
    this.runs = new Map();
    /** @type {Connection | null} */
    this.connection = null;
    /** @type {ConnectionState} */
    this.state = "idle";
    this.retryFloorMs = DEFAULT_RETRY_MS;
    this.attempt = 0;
    /** @type {any} */
    this.reopenTimer = null;
    /** @type {any} */
    this.retryTimer = null;
  }

  /**
   * Follow `runId` from `cursor` (the seq of the last event the listener has).
   *
   * `listener` may have onEvent(envelope), onSnapshot(run), onError({run_id, error})
   * and onConnection(state). Returns the function that stops following.
   * @param {string} runId
   * @param {number} cursor
   * @param {Listener} listener
   * @returns {() => void}
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
    const registered = entry;
    return () => this._unregister(registered, registration);
  }

  /**
   * @param {Entry} entry
   * @param {Registration} registration
   */
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
  /** @param {Entry[]} runs */
  _carries(runs) {
    const connection = this.connection;
    if (connection === null || connection.runIds.size !== runs.length) return false;
    return runs.every(
      (entry) => connection.runIds.has(entry.runId) && entry.cursor >= (connection.positions.get(entry.runId) ?? Infinity)
    );
  }

  _close() {
    const connection = this.connection;
    if (connection === null) return;
    this.connection = null;
    connection.controller.abort();
    if (connection.reader !== null) connection.reader.cancel().catch(() => {});
  }

  /** @param {Entry[]} runs */
  async _connect(runs) {
    /** @type {Connection} */
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

  /** @param {Connection} connection */
  async _read(connection) {
    const decoder = new TextDecoder();
    const parser = new SSEParser();
    try {
      for (;;) {
        const { value, done } = await /** @type {ReadableStreamDefaultReader<Uint8Array>} */ (connection.reader).read();
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
  /** @param {Connection} connection */
  async _ended(connection) {
    this.connection = null;
    const unfinished = [...connection.runIds].filter((runId) => this.runs.has(runId));
    await Promise.all(unfinished.map((runId) => this._readRun(runId)));
    if (this.connection !== null || this.reopenTimer !== null || this.retryTimer !== null) return;
    if (this.runs.size > 0) this._lost();
    else this.state = "idle";
  }

  /** @param {string} runId */
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

  /**
   * @param {import("./sse.js").Frame} frame
   * @param {Connection} connection
   */
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

  /**
   * @param {Entry} entry
   * @param {any} envelope
   * @param {Connection} connection
   */
  _event(entry, envelope, connection) {
    if (!isSeq(envelope.seq)) {
      // Let the views see it: to them it is a protocol error to show.
      for (const { listener } of entry.registrations) call(listener, "onEvent", envelope);
      return;
    }
    entry.cursor = Math.max(entry.cursor, envelope.seq);
    connection.positions.set(entry.runId, entry.cursor);
    if (isTerminalType(envelope.type)) this._finish(entry);
    for (const registration of entry.registrations) {
      if (envelope.seq <= registration.cursor) continue; // this listener has it already
      registration.cursor = envelope.seq;
      call(registration.listener, "onEvent", envelope);
    }
  }

  /**
   * @param {Entry} entry
   * @param {any} run
   * @param {Connection | null} connection
   */
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

  /**
   * @param {Entry} entry
   * @param {any} data
   */
  _error(entry, data) {
    this._finish(entry);
    for (const { listener } of entry.registrations) call(listener, "onError", data);
  }

  // A finished run leaves the next connection; runs waiting for a slot may take it.
  // Finishing comes before telling the listeners, so that their unregistering
  // (a view stops following a finished run) does not count as a change.
  /** @param {Entry} entry */
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

  /** @param {ConnectionState} state */
  _announce(state) {
    this.state = state;
    for (const entry of [...this.runs.values()]) {
      for (const { listener } of [...entry.registrations]) call(listener, "onConnection", state);
    }
  }
}

// One listener's mistake must not stop the stream for the others.
/**
 * @param {Listener} listener
 * @param {keyof Listener} method
 * @param {any} argument
 */
function call(listener, method, argument) {
  const handler = listener[method];
  if (typeof handler !== "function") return;
  try {
    handler.call(listener, argument);
  } catch (error) {
    console.error(`agentruns: a listener's ${method} failed`, error);
  }
}

/**
 * The page's hub, created on first use with `options`.
 *
 * Each widget may load its own copy of this module, so the hub lives on globalThis.
 * @param {StreamHubOptions} [options]
 * @returns {StreamHub}
 */
export function getStreamHub(options = {}) {
  const page = /** @type {Record<string, any>} */ (globalThis);
  if (!page[STREAM_HUB_KEY]) page[STREAM_HUB_KEY] = new StreamHub(options);
  return page[STREAM_HUB_KEY];
}
