// Restoring run outputs that never reached the notebook's file.
//
// A page refreshed before the notebook was saved loses the outputs of the
// cells it ran, though their runs go on on the server. When the notebook
// opens again, the server lists the runs its cells submitted (each run's
// metadata.cell_id names its cell); a cell that submitted a run after the
// file was last saved, and shows no output of that run, gets one back.
// Runs older than the file are left alone: the user may have cleared them.

import { runsUrl } from "./api.js";
import { MIME_TYPE, fetchRecord, plainText } from "./record.js";

/**
 * @typedef {import("./runstate.js").Run} Run
 * @typedef {{id: string, type: string, runIds: string[]}} CellInfo what the plugin needs of a cell
 * @typedef {{output_type: "display_data", data: Record<string, any>, metadata: Record<string, any>}} DisplayData
 * @typedef {(url: string, init: RequestInit) => Promise<Response>} Fetch
 */

/** Runs asked for per page of the list. */
export const PAGE_SIZE = 50;

/**
 * @param {string | null | undefined} text
 * @returns {number}
 */
function time(text) {
  const ms = text ? Date.parse(text) : NaN;
  return Number.isNaN(ms) ? -Infinity : ms;
}

/**
 * The notebook's runs created after `since` (ms), newest first, paging while they are newer.
 * @param {Fetch} fetch
 * @param {string} baseUrl
 * @param {string} path the notebook's path on the server
 * @param {number} since
 * @returns {Promise<Run[]>}
 */
export async function runsSince(fetch, baseUrl, path, since) {
  /** @type {Run[]} */
  const found = [];
  let before = null;
  for (;;) {
    const query = new URLSearchParams({ notebook: path, limit: String(PAGE_SIZE) });
    if (before !== null) query.set("before", before);
    const response = await fetch(`${runsUrl(baseUrl)}?${query}`, {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    });
    if (!response.ok) throw new Error(`listing the notebook's runs: the server answered ${response.status}`);
    const page = await response.json();
    const runs = Array.isArray(page.runs) ? page.runs : [];
    let older = false;
    for (const run of runs) {
      if (time(run.created_at) > since) found.push(run);
      else older = true;
    }
    if (older || !page.next || runs.length === 0) return found;
    before = page.next;
  }
}

/**
 * For each code cell, the newest of `runs` it submitted, when the cell does not show it.
 * @param {CellInfo[]} cells
 * @param {Run[]} runs newest first
 * @returns {{cellId: string, run: Run}[]}
 */
export function lostRuns(cells, runs) {
  /** @type {Map<string, Run>} */
  const newest = new Map();
  for (const run of runs) {
    const cellId = run.metadata && typeof run.metadata.cell_id === "string" ? run.metadata.cell_id : null;
    if (cellId === null) continue;
    const seen = newest.get(cellId);
    if (seen === undefined || time(run.created_at) > time(seen.created_at)) newest.set(cellId, run);
  }
  /** @type {{cellId: string, run: Run}[]} */
  const lost = [];
  for (const cell of cells) {
    if (cell.type !== "code") continue;
    const run = newest.get(cell.id);
    if (run !== undefined && !cell.runIds.includes(run.run_id)) lost.push({ cellId: cell.id, run });
  }
  return lost;
}

/**
 * The output that shows `run` in its cell: our mime data, the record, and text.
 * @param {Run} run
 * @param {string | null} record
 * @returns {DisplayData}
 */
export function runOutput(run, record) {
  /** @type {Record<string, any>} */
  const data = {
    [MIME_TYPE]: { run_id: run.run_id, status: run.status, last_seq: run.last_seq, agent: run.agent },
    "text/plain": plainText(run.run_id, run.status),
  };
  if (record !== null) data["text/markdown"] = record;
  return { output_type: "display_data", data, metadata: {} };
}

/**
 * The run ids that a cell's outputs show.
 * @param {Iterable<{data?: Record<string, any>}>} outputs
 * @returns {string[]}
 */
export function shownRunIds(outputs) {
  const ids = [];
  for (const output of outputs) {
    const value = output.data ? output.data[MIME_TYPE] : null;
    if (value && typeof value.run_id === "string") ids.push(value.run_id);
  }
  return ids;
}

/**
 * Find the runs the notebook lost and the outputs that bring them back.
 * @param {{fetch: Fetch, baseUrl: string, path: string, lastModified: string | null, cells: CellInfo[]}} notebook
 * @returns {Promise<{cellId: string, output: DisplayData}[]>}
 */
export async function restoreOutputs({ fetch, baseUrl, path, lastModified, cells }) {
  const since = time(lastModified);
  if (since === -Infinity) return []; // no saved file to compare with
  const runs = await runsSince(fetch, baseUrl, path, since);
  const lost = lostRuns(cells, runs);
  return Promise.all(
    lost.map(async ({ cellId, run }) => ({
      cellId,
      output: runOutput(run, await fetchRecord(fetch, runsUrl(baseUrl, run.run_id))),
    }))
  );
}
