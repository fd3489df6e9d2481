// Restoring run outputs that never reached the notebook's file.
//
// A page refreshed before the notebook was saved loses the outputs of the
// cells it ran, though their runs go on on the server. When the notebook
// opens again, the server lists the runs its cells submitted (each run's
// metadata.cell_id names its cell); a cell that submitted a run after the
// file was last saved, and shows no output of that run, gets one back.
// Runs older than the file are left alone: the user may have cleared them.
//
// A run goes back only under the code that made it (submit() records a hash
// of the cell's code in metadata.cell_source_sha256): when the saved cell
// holds other code, the run comes back with a plain word that it came from
// code that was not saved, and that code. Runs whose cells are not in the
// saved notebook are handed back to be listed in one notice.

import { runsUrl } from "./api.js";
import { isPlainObject } from "./json.js";
import { MIME_TYPE, fetchRecord, plainText } from "./record.js";
import { sha256Hex } from "./sha256.js";

/**
 * @typedef {import("./runstate.js").Run} Run
 * @typedef {{id: string, type: string, runIds: string[], source?: string}} CellInfo what the plugin needs of a cell
 * @typedef {{output_type: "display_data", data: Record<string, any>, metadata: Record<string, any>}} DisplayData
 * @typedef {{cellId: string, run: Run, unsaved: boolean}} LostRun
 * @typedef {import("./api.js").Fetch} Fetch
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
 * The cell a run names (metadata.cell_id), or null.
 * @param {Run} run
 * @returns {string | null}
 */
function cellOf(run) {
  return isPlainObject(run.metadata) && typeof run.metadata.cell_id === "string" ? run.metadata.cell_id : null;
}

/**
 * Each cell's newest run of `runs`.
 * @param {Run[]} runs
 * @returns {Map<string, Run>}
 */
function newestByCell(runs) {
  /** @type {Map<string, Run>} */
  const newest = new Map();
  for (const run of runs) {
    const cellId = cellOf(run);
    if (cellId === null) continue;
    const seen = newest.get(cellId);
    if (seen === undefined || time(run.created_at) > time(seen.created_at)) newest.set(cellId, run);
  }
  return newest;
}

/**
 * Whether `run` was submitted by other code than `source` (false when the run did not record its code).
 * @param {Run} run
 * @param {string | undefined} source
 */
export function fromOtherCode(run, source) {
  const digest = isPlainObject(run.metadata) ? run.metadata.cell_source_sha256 : null;
  return typeof digest === "string" && typeof source === "string" && digest !== sha256Hex(source);
}

/**
 * For each code cell, the newest of `runs` it submitted, when the cell does not show it,
 * and whether the cell now holds other code than the code that submitted it.
 * @param {CellInfo[]} cells
 * @param {Run[]} runs newest first
 * @returns {LostRun[]}
 */
export function lostRuns(cells, runs) {
  const newest = newestByCell(runs);
  /** @type {LostRun[]} */
  const lost = [];
  for (const cell of cells) {
    if (cell.type !== "code") continue;
    const run = newest.get(cell.id);
    if (run !== undefined && !cell.runIds.includes(run.run_id)) {
      lost.push({ cellId: cell.id, run, unsaved: fromOtherCode(run, cell.source) });
    }
  }
  return lost;
}

/**
 * The newest run of each cell that is not a code cell of the notebook any more
 * (never saved, deleted, or turned into Markdown), newest first.
 * @param {CellInfo[]} cells
 * @param {Run[]} runs newest first
 * @returns {Run[]}
 */
export function goneRuns(cells, runs) {
  const code = new Set(cells.filter((cell) => cell.type === "code").map((cell) => cell.id));
  return [...newestByCell(runs)]
    .filter(([cellId]) => !code.has(cellId))
    .map(([, run]) => run)
    .sort((a, b) => time(b.created_at) - time(a.created_at));
}

/**
 * A Markdown code block that holds `code` whatever backticks it has.
 * @param {string} code
 */
function fenced(code) {
  const longest = Math.max(0, ...(code.match(/`+/g) || []).map((ticks) => ticks.length));
  const fence = "`".repeat(Math.max(3, longest + 1));
  return `${fence}\n${code.replace(/\n$/, "")}\n${fence}`;
}

/**
 * The output that says plainly, above a restored run, that the cell's saved
 * code is not the code that made it, and shows that code when the run kept it.
 * @param {Run} run
 * @returns {DisplayData}
 */
export function unsavedCodeNotice(run) {
  const source = isPlainObject(run.metadata) && typeof run.metadata.cell_source === "string" ? run.metadata.cell_source : null;
  const head = "This run came from code you did not save";
  const markdown = source === null
    ? `**${head}** (it was too long to keep with the run).`
    : `**${head}:**\n\n${fenced(source)}`;
  const plain = source === null ? `${head}.` : `${head}:\n${source}`;
  return {
    output_type: "display_data",
    data: { "text/markdown": markdown, "text/plain": plain },
    metadata: { agentruns: { unsaved_code_of: run.run_id } },
  };
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
 * Find the runs the notebook lost and the outputs that bring them back, and
 * the runs whose cells are gone.
 * @param {{fetch: Fetch, baseUrl: string, path: string, lastModified: string | null, cells: CellInfo[]}} notebook
 * @returns {Promise<{restored: {cellId: string, outputs: DisplayData[]}[], gone: Run[]}>}
 */
export async function restoreOutputs({ fetch, baseUrl, path, lastModified, cells }) {
  const since = time(lastModified);
  if (since === -Infinity) return { restored: [], gone: [] }; // no saved file to compare with
  const runs = await runsSince(fetch, baseUrl, path, since);
  const restored = await Promise.all(
    lostRuns(cells, runs).map(async ({ cellId, run, unsaved }) => {
      const output = runOutput(run, await fetchRecord(fetch, runsUrl(baseUrl, run.run_id)));
      return { cellId, outputs: unsaved ? [unsavedCodeNotice(run), output] : [output] };
    })
  );
  return { restored, gone: goneRuns(cells, runs) };
}
