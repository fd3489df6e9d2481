// Which agent wrote a notebook cell, as the cell shows it.
//
// A cell an agent inserted, edited or executed carries `metadata.agentruns =
// {run_id, edit_id}`. Its mark names the run's agent (read once per run) and
// opens the run's page. Plain DOM and fetch, no JupyterLab import: the
// labextension (cellmarks.js) puts the marks on the notebook's cells.

import { apiFetch, runsUrl, withSlash } from "./api.js";
import { element } from "./dom.js";
import { isPlainObject } from "./json.js";

/** An agent's name in a mark is cut to this many characters (the whole in its title). */
export const MARK_NAME_CHARS = 24;

/**
 * @typedef {{runId: string, editId: string | null}} Stamp
 */

/**
 * The stamp a cell's metadata carries when an agent wrote it, or null.
 * @param {unknown} metadata the cell's metadata, or its `agentruns` entry's holder
 * @returns {Stamp | null}
 */
export function cellStamp(metadata) {
  const stamp = isPlainObject(metadata) ? metadata.agentruns : undefined;
  if (!isPlainObject(stamp) || typeof stamp.run_id !== "string" || !stamp.run_id) return null;
  return { runId: stamp.run_id, editId: typeof stamp.edit_id === "string" && stamp.edit_id ? stamp.edit_id : null };
}

/**
 * What a mark says: the agent's name (cut), or "agent" while it is not known.
 * @param {string | null} agent
 * @returns {string}
 */
export function markLabel(agent) {
  if (agent === null || agent === "") return "agent";
  return agent.length > MARK_NAME_CHARS ? `${agent.slice(0, MARK_NAME_CHARS - 1)}…` : agent;
}

/**
 * A mark's title: who wrote the cell, in which run and edit, and what a click does.
 * @param {Stamp} stamp
 * @param {string | null} agent
 * @param {boolean} opens whether a click opens the run's page here
 * @returns {string}
 */
export function markTitle(stamp, agent, opens) {
  const who = agent ? `the agent ${agent}` : "an agent";
  const edit = stamp.editId ? `, edit ${stamp.editId}` : "";
  return `Written by ${who}: run ${stamp.runId}${edit}.${opens ? " Open the run's page." : ""}`;
}

/**
 * The agents of runs, read once per run from the server (`GET runs/{id}`).
 * A run the server does not give (deleted, another person's) has no known
 * agent; a server out of reach is asked again the next time.
 */
export class AgentNames {
  /** @param {{baseUrl: string}} options */
  constructor({ baseUrl }) {
    this.baseUrl = withSlash(baseUrl);
    /** @type {Map<string, Promise<string | null>>} */
    this.names = new Map();
  }

  /**
   * The agent of `runId`, or null when the server does not say.
   * @param {string} runId
   * @returns {Promise<string | null>}
   */
  agent(runId) {
    let name = this.names.get(runId);
    if (name === undefined) {
      name = this._read(runId).catch(() => {
        this.names.delete(runId);
        return null;
      });
      this.names.set(runId, name);
    }
    return name;
  }

  /**
   * The server's answer for `runId`; throws when there is none.
   * @param {string} runId
   * @returns {Promise<string | null>}
   */
  async _read(runId) {
    const response = await apiFetch(runsUrl(this.baseUrl, runId));
    if (!response.ok) return null;
    const run = await response.json();
    return isPlainObject(run) && typeof run.agent === "string" && run.agent ? run.agent : null;
  }
}

/**
 * A cell's mark: the agent's name, a title saying the run and the edit, and,
 * where run pages open, a button (reached with Tab) that opens the run's page.
 * @param {Stamp} stamp
 * @param {((runId: string) => void) | null} open
 * @returns {HTMLElement}
 */
export function markNode(stamp, open) {
  const node = element(open ? "button" : "span", "agentruns-cell-mark");
  if (open) {
    /** @type {HTMLButtonElement} */ (node).type = "button";
    // Enter and Space press the mark: JupyterLab's notebook shortcuts (Enter edits the cell) leave it alone.
    node.dataset.lmSuppressShortcuts = "true";
    node.addEventListener("click", (event) => {
      // The cell under the mark stays as it was: no selection, no edit mode.
      event.stopPropagation();
      open(stamp.runId);
    });
    node.addEventListener("mousedown", (event) => event.stopPropagation());
  }
  node.append(element("span", "agentruns-cell-mark-icon", "✦"), element("span", "agentruns-cell-mark-name"));
  showAgent(node, stamp, null);
  return node;
}

/**
 * Say in `node` (a mark) which agent wrote the cell.
 * @param {HTMLElement} node
 * @param {Stamp} stamp
 * @param {string | null} agent
 */
export function showAgent(node, stamp, agent) {
  node.dataset.runId = stamp.runId;
  node.dataset.editId = stamp.editId ?? "";
  node.dataset.agent = agent ?? "";
  /** @type {HTMLElement} */ (node.lastChild).textContent = markLabel(agent);
  node.title = markTitle(stamp, agent, node.tagName === "BUTTON");
  node.setAttribute("aria-label", node.title);
}
