// The page's link to the server for agents' notebook edits: the page says
// which notebooks it has open, gives the server a notebook as its model holds
// it (unsaved work included), and makes an agent's change on that model, then
// saves, so the person sees the edit at once and nothing of theirs is lost.
//
// A change is offered with a claim: the page claims it first and makes it only
// once the server says it is this page's (another page holding the notebook,
// or a server that gave up waiting, gets it refused). The messages are those
// of jupyter_agentruns/notebook_tools/pages.py.

import { DEFAULT_RETRY_MS, backoffDelay } from "./backoff.js";

/**
 * @typedef {import("@jupyter/ydoc").ISharedNotebook} SharedNotebook
 * @typedef {{kind: "insert", index: number, after: string | null, cell: Record<string, any>}
 *   | {kind: "replace", cell: Record<string, any>, source: string}
 *   | {kind: "delete", cell_id: string, source: string}} Change
 *   a change as the server sends it: cells by id, with the source the cell must still hold
 * @typedef {object} PageNotebooks what the page holds, as the link asks it
 * @property {() => string[]} paths the notebooks open now (paths under the server's root)
 * @property {(path: string) => object | null | Promise<object | null>} read a notebook as its model
 *   holds it now (null: not here, or not as the file is now)
 * @property {(path: string, change: Change) => string | null} make the change on the model: null, or why not
 * @property {(path: string) => Promise<void>} save save the notebook
 * @property {(path: string) => Promise<void>} [saved] the notebook's file may have changed (another
 *   page saved a change, the server changed the file, the link was down): read it again if it
 *   is newer, unless this page holds unsaved work of it
 */

/** The close code of a server whose notebook tools are off: the link does not come back. */
export const UNAVAILABLE = 4004;

/**
 * Make `change` on a notebook's shared model, by cell id; nothing is changed when it
 * does not fit (the cell it goes after is gone, the cell holds something else now).
 * @param {SharedNotebook} notebook
 * @param {Change} change
 * @returns {string | null} null when made, else why not
 */
export function makeChange(notebook, change) {
  const ids = notebook.cells.map((cell) => cell.id);
  if (change.kind === "insert") {
    if (ids.includes(change.cell.id)) return `the notebook has a cell ${change.cell.id} already`;
    const after = change.after === null ? -1 : ids.indexOf(change.after);
    if (after === -1 && change.after !== null) return `the cell ${change.after} it goes after is gone`;
    notebook.insertCell(after + 1, /** @type {any} */ (change.cell));
    return null;
  }
  const cellId = change.kind === "delete" ? change.cell_id : change.cell.id;
  const index = ids.indexOf(cellId);
  if (index === -1) return `the cell ${cellId} is gone`;
  const cell = notebook.cells[index];
  if (cell.getSource() !== change.source) return `the cell ${cellId} changed in the page since it was read`;
  if (change.kind === "delete") {
    notebook.deleteCell(index);
    return null;
  }
  const next = change.cell;
  if (next.cell_type !== cell.cell_type) return `the cell ${cellId} is a ${cell.cell_type} cell now`;
  notebook.transact(() => {
    cell.setSource(typeof next.source === "string" ? next.source : (next.source || []).join(""));
    const metadata = next.metadata || {};
    // setMetadata sets the keys it is given and keeps the others: an undo takes the stamp away.
    for (const key of Object.keys(cell.getMetadata())) if (!(key in metadata)) cell.deleteMetadata(key);
    cell.setMetadata(metadata);
    if (cell.cell_type === "code" && Array.isArray(next.outputs)) {
      const code = /** @type {import("@jupyter/ydoc").YCodeCell} */ (/** @type {unknown} */ (cell));
      code.setOutputs(next.outputs);
      code.execution_count = next.execution_count ?? null;
    }
  });
  return null;
}

/**
 * What a person's work in a notebook is, to tell whether a page holds some not saved yet:
 * its cells' ids, types, sources and outputs. Not the notebook's metadata, which JupyterLab
 * changes by itself (a kernel that starts writes its language), nor the cells'.
 * @param {{cells?: unknown}} notebook nbformat, as a model's toJSON gives it
 * @returns {string}
 */
export function workOf(notebook) {
  const cells = Array.isArray(notebook.cells) ? notebook.cells : [];
  return JSON.stringify(
    cells.map((/** @type {any} */ cell) => {
      const source = Array.isArray(cell.source) ? cell.source.join("") : cell.source;
      return [cell.id, cell.cell_type, source, cell.outputs ?? null];
    })
  );
}

/**
 * The WebSocket URL of the link under `baseUrl` (a path, or a full http(s) URL).
 * @param {string} baseUrl
 * @param {string} pageUrl the page's own URL
 * @returns {string}
 */
export function linkUrl(baseUrl, pageUrl) {
  const url = new URL(`${baseUrl.replace(/\/?$/, "/")}api/agentruns/pages`, pageUrl);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  return url.toString();
}

/** One page's link: reconnects while the page lives, answers reads and makes the changes it claimed. */
export class PageLink {
  /**
   * @param {object} options
   * @param {string} options.url the link's WebSocket URL (see linkUrl)
   * @param {PageNotebooks} options.notebooks
   * @param {typeof WebSocket} [options.WebSocket]
   * @param {(callback: () => void, ms: number) => any} [options.setTimeout]
   * @param {() => number} [options.random]
   * @param {(...args: any[]) => void} [options.warn]
   */
  constructor({ url, notebooks, WebSocket = globalThis.WebSocket, setTimeout = globalThis.setTimeout, random = Math.random, warn = console.warn }) {
    this.url = url;
    this.notebooks = notebooks;
    this._WebSocket = WebSocket;
    this._setTimeout = setTimeout;
    this._random = random;
    this._warn = warn;
    /** @type {WebSocket | null} */
    this.socket = null;
    this.attempt = 0;
    this.stopped = false;
    /** @type {Map<string, {path: string, change: Change}>} claim -> the change offered */
    this.offers = new Map();
  }

  /** Open the link (and again after it drops, with backoff, until stop). */
  start() {
    if (this.stopped || this.socket !== null) return;
    const socket = new this._WebSocket(this.url);
    this.socket = socket;
    socket.onopen = () => {
      this.attempt = 0;
      this.tell();
      // Its notebooks may have changed in their files while the link was down (or before it
      // first came up, the page loading): each is read again where it holds no unsaved work.
      for (const path of this.notebooks.paths()) void this.fileChanged(path);
    };
    socket.onmessage = (event) => void this.receive(typeof event.data === "string" ? event.data : "");
    socket.onclose = (event) => {
      this.socket = null;
      this.offers.clear();
      if (event.code === UNAVAILABLE) this.stopped = true;
      if (this.stopped) return;
      this.attempt += 1;
      this._setTimeout(() => this.start(), backoffDelay(this.attempt, DEFAULT_RETRY_MS, this._random));
    };
  }

  /** Close the link for good. */
  stop() {
    this.stopped = true;
    if (this.socket !== null) this.socket.close();
  }

  /** Tell the server which notebooks the page has open now (call whenever that changes). */
  tell() {
    this.send({ type: "open", notebooks: this.notebooks.paths() });
  }

  /** @param {Record<string, unknown>} message */
  send(message) {
    const socket = this.socket;
    if (socket !== null && socket.readyState === 1) socket.send(JSON.stringify(message));
  }

  /**
   * One message from the server.
   * @param {string} text
   */
  async receive(text) {
    /** @type {any} */
    let message;
    try {
      message = JSON.parse(text);
    } catch {
      return;
    }
    switch (message.type) {
      case "read":
        this.send({ type: "content", request: message.request, content: await this.read(message.notebook) });
        return;
      case "make":
        if (!this.notebooks.paths().includes(message.notebook)) return; // closed meanwhile: not ours to claim
        this.offers.set(message.claim, { path: message.notebook, change: message.change });
        this.send({ type: "claim", claim: message.claim });
        return;
      case "claimed":
        await this.made(message.claim);
        return;
      case "refused":
        this.offers.delete(message.claim);
        return;
      case "saved":
        await this.fileChanged(message.notebook);
        return;
      case "error":
        this._warn("agentruns: the server refused a message of the page's link:", message.message);
        return;
    }
  }

  /**
   * The file of the notebook `path` may have changed: the page reads it again if it holds no unsaved work.
   * @param {string} path
   */
  async fileChanged(path) {
    try {
      await this.notebooks.saved?.(path);
    } catch (error) {
      this._warn("agentruns: could not read again a notebook changed in its file:", error);
    }
  }

  /**
   * A notebook as the page holds it, or null (not here, not as the file is now, or unreadable).
   * @param {string} path
   * @returns {Promise<object | null>}
   */
  async read(path) {
    try {
      return await this.notebooks.read(path);
    } catch (error) {
      this._warn("agentruns: could not read the notebook for the server:", error);
      return null;
    }
  }

  /**
   * The change of `claim` is this page's: made on the model at once (before any later
   * message is read), saved, and the server told.
   * @param {string} claim
   */
  async made(claim) {
    const offer = this.offers.get(claim);
    this.offers.delete(claim);
    if (offer === undefined) return;
    let why = null;
    try {
      why = this.notebooks.make(offer.path, offer.change);
    } catch (error) {
      why = `the page could not make it: ${error}`;
    }
    if (why === null) {
      try {
        await this.notebooks.save(offer.path);
      } catch (error) {
        why = `the page made it but could not save: ${error}`;
      }
    }
    this.send(why === null ? { type: "made", claim, ok: true } : { type: "made", claim, ok: false, reason: why });
  }
}
