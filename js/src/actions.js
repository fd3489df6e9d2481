// What a person can do to a run from the page: Cancel, Run again, Retry from here, Answer, Undo an edit, New run.
//
// The run view (in a notebook and on a run's own page), the runs panel and
// table, and the question toasts all act through RunActions, with one rule:
// an intended action has one Idempotency-Key, kept until the server answered.
// A double click joins the request under way; a retry after a network error
// sends the same key again, so the server never makes two runs of one click.
// Once the server answered (yes or no), the next click is a new action.
//
// The widget's bundle and the labextension's are separate copies of this
// module on one page, and a person may click Run again in a notebook, lose
// the network, then try again from the panel: the actions under way live on
// globalThis, so both copies see the same ones.

import { apiFetch, errorMessage, newIdempotencyKey, runsUrl, withSlash } from "./api.js";

/**
 * @typedef {import("./runstate.js").Run} Run
 * @typedef {import("./api.js").Fetch} Fetch
 * @typedef {{run: Run, problem: null} | {run: null, problem: string}} Outcome the run as the server answered, or why not
 * @typedef {{key: string, pending: Promise<Outcome> | null}} Intent an action a person meant, and its request under way
 * @typedef {Map<string, Intent>} Intents
 * @typedef {{baseUrl: string, fetch?: Fetch, intents?: Intents}} ActionsOptions
 */

/** Why an action failed when no answer came back. */
export const UNREACHABLE = "cannot reach the server.";

// Its shape (a Map of {key, pending}) is shared with older and newer copies of this module: keep it.
const INTENTS_KEY = "__jupyterAgentrunsActions";

/**
 * The page's actions under way, shared by every copy of this module.
 * @returns {Intents}
 */
export function pageIntents() {
  const page = /** @type {Record<string, any>} */ (globalThis);
  if (!(page[INTENTS_KEY] instanceof Map)) page[INTENTS_KEY] = new Map();
  return page[INTENTS_KEY];
}

/** Cancel, Run again, Answer and Undo for the runs of the server at `baseUrl`: each action sent once, with one key. */
export class RunActions {
  /** @param {ActionsOptions} options `intents` only for a test: else the page's */
  constructor(options) {
    this.baseUrl = withSlash(options.baseUrl);
    this.fetch = options.fetch || apiFetch;
    this.intents = options.intents || pageIntents();
  }

  /**
   * Ask the server to cancel a run; the same cancel again changes nothing there.
   * @param {string} runId
   * @param {string} reason what the run's record says of it
   * @returns {Promise<Outcome>}
   */
  cancel(runId, reason) {
    return this._act(`cancel ${runId}`, () => ({
      url: `${runsUrl(this.baseUrl, runId)}/cancel`,
      init: { method: "POST", body: { reason } },
    }));
  }

  /**
   * Start a new run with what `run` was asked, as its retry.
   * @param {Run} run
   * @returns {Promise<Outcome>}
   */
  runAgain(run) {
    const { agent, input, session, metadata } = run;
    return this._act(`again ${run.run_id}`, (key) => ({
      url: runsUrl(this.baseUrl),
      init: { method: "POST", headers: { "Idempotency-Key": key }, body: { agent, input, session, metadata, retry_of: run.run_id } },
    }));
  }

  /**
   * Start a run that no earlier one leads to (New run): `form` names the
   * form it comes from, so a double click or a retry after a network error
   * is the same run.
   * @param {string} form
   * @param {{agent: string, input: object, session?: string, metadata?: object}} body
   * @returns {Promise<Outcome>}
   */
  start(form, body) {
    return this._act(`start ${form}`, (key) => ({
      url: runsUrl(this.baseUrl),
      init: { method: "POST", headers: { "Idempotency-Key": key }, body },
    }));
  }

  /**
   * Start a run from the state after event `atSeq` of `runId` (Retry from here), `input`'s
   * fields over the original's; a double click or a retry is the same fork.
   * @param {string} runId
   * @param {number} atSeq
   * @param {object} input
   * @returns {Promise<Outcome>}
   */
  fork(runId, atSeq, input) {
    return this._act(`fork ${runId} ${atSeq} ${JSON.stringify(input)}`, (key) => ({
      url: `${runsUrl(this.baseUrl, runId)}/fork`,
      init: { method: "POST", headers: { "Idempotency-Key": key }, body: { at_seq: atSeq, input } },
    }));
  }

  /**
   * Answer a run's question; the same answer again changes nothing there.
   * @param {string} runId
   * @param {string} requestId
   * @param {string} choice
   * @param {string} [note]
   * @returns {Promise<Outcome>}
   */
  answer(runId, requestId, choice, note) {
    return this._act(`answer ${runId} ${requestId} ${choice}`, () => ({
      url: `${runsUrl(this.baseUrl, runId)}/inputs/${encodeURIComponent(requestId)}`,
      init: { method: "POST", body: note === undefined ? { choice } : { choice, note } },
    }));
  }

  /**
   * Undo one of a run's notebook edits. The server refuses (409 `edit_conflict`)
   * when the edit's cell changed since; the outcome's problem says so in its words.
   * @param {string} runId
   * @param {string} editId
   * @returns {Promise<Outcome>}
   */
  undo(runId, editId) {
    return this._act(`undo ${runId} ${editId}`, () => ({
      url: `${runsUrl(this.baseUrl, runId)}/edits/${encodeURIComponent(editId)}/undo`,
      init: { method: "POST" },
    }));
  }

  /**
   * Send the action `name` once: a call while it is under way gets its
   * outcome; its key stays until the server answered.
   * @param {string} name
   * @param {(key: string) => {url: string, init: import("./api.js").ApiInit}} request
   * @returns {Promise<Outcome>}
   */
  _act(name, request) {
    let intent = this.intents.get(name);
    if (intent === undefined) {
      intent = { key: newIdempotencyKey(), pending: null };
      this.intents.set(name, intent);
    }
    if (intent.pending !== null) return intent.pending;
    const sent = intent;
    const { url, init } = request(sent.key);
    sent.pending = this._send(url, init).then(({ outcome, answered }) => {
      sent.pending = null;
      // Answered: the next click is a new action. Unreached: a retry sends this key again.
      if (answered && this.intents.get(name) === sent) this.intents.delete(name);
      return outcome;
    });
    return sent.pending;
  }

  /**
   * @param {string} url
   * @param {import("./api.js").ApiInit} init
   * @returns {Promise<{outcome: Outcome, answered: boolean}>}
   */
  async _send(url, init) {
    let response;
    try {
      response = await this.fetch(url, init);
    } catch {
      return { outcome: { run: null, problem: UNREACHABLE }, answered: false };
    }
    if (!response.ok) return { outcome: { run: null, problem: await errorMessage(response) }, answered: true };
    try {
      return { outcome: { run: await response.json(), problem: null }, answered: true };
    } catch {
      return { outcome: { run: null, problem: `the server answered ${response.status} without a run` }, answered: true };
    }
  }
}
