// Keeping the notebook's record of a run current.
//
// A run's output carries, beside the live view, a static record: our mime
// data (state at display time) and `text/markdown` written by the server.
// These pure functions decide what the output's data should become.

import { isPlainObject } from "./json.js";

/** The mime type of a run output; its data is RunMimeData. */
export const MIME_TYPE = "application/vnd.jupyter.agentruns.run+json";

/**
 * @typedef {{run_id: string, status: string, last_seq: number, agent: string}} RunMimeData
 * @typedef {Record<string, any>} MimeBundle
 */

/**
 * The run data of an output bundle, or null when it has none worth reading.
 * @param {MimeBundle} data
 * @returns {RunMimeData | null}
 */
export function runData(data) {
  const value = data[MIME_TYPE];
  if (!isPlainObject(value) || typeof value.run_id !== "string" || !value.run_id) return null;
  return {
    run_id: value.run_id,
    status: typeof value.status === "string" ? value.status : "",
    last_seq: Number.isSafeInteger(value.last_seq) ? value.last_seq : 0,
    agent: typeof value.agent === "string" ? value.agent : "",
  };
}

/**
 * What `text/plain` says of a run: the same as the Python widget's repr of a restored run.
 * @param {string} runId
 * @param {string} status
 * @returns {string}
 */
export function plainText(runId, status) {
  return `Run(run_id='${runId}', status='${status}')`;
}

/**
 * The bundle an output should hold for `run` with the server's `record`, or
 * null when it holds exactly that already (so an up-to-date notebook is
 * never made dirty).
 * @param {MimeBundle} data the output's data now
 * @param {RunMimeData} run the run's state now
 * @param {string | null} record the server's text/markdown, or null to keep the saved one
 * @returns {MimeBundle | null}
 */
export function updatedBundle(data, run, record) {
  const saved = runData(data);
  /** @type {MimeBundle} */
  const next = { ...data, [MIME_TYPE]: { ...(isPlainObject(data[MIME_TYPE]) ? data[MIME_TYPE] : {}), ...run } };
  if (record !== null) next["text/markdown"] = record;
  // Our own text/plain follows the run; a kernel's repr is left alone.
  const plain = data["text/plain"];
  if (typeof plain !== "string" || plain.startsWith("Run(run_id=")) next["text/plain"] = plainText(run.run_id, run.status);
  const unchanged =
    saved !== null &&
    saved.run_id === run.run_id &&
    saved.status === run.status &&
    saved.last_seq === run.last_seq &&
    saved.agent === run.agent &&
    next["text/markdown"] === data["text/markdown"] &&
    next["text/plain"] === data["text/plain"];
  return unchanged ? null : next;
}

/**
 * The bundle for an output that switched to a new run (Run again): its old record no longer applies.
 * @param {MimeBundle} data
 * @param {RunMimeData} run
 * @param {string | null} record the new run's record, if the server gave one
 * @returns {MimeBundle}
 */
export function switchedBundle(data, run, record) {
  /** @type {MimeBundle} */
  const next = { ...data, [MIME_TYPE]: run, "text/plain": plainText(run.run_id, run.status) };
  if (record !== null) next["text/markdown"] = record;
  else delete next["text/markdown"];
  return next;
}

/**
 * Fetch a run's record (`text/markdown`) from the server: the text, or null
 * when the server has no record to give (an error, or an answer of another type).
 * @param {import("./api.js").Fetch} fetch
 * @param {string} url the run's URL
 * @returns {Promise<string | null>}
 */
export async function fetchRecord(fetch, url) {
  try {
    const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/markdown" } });
    const type = response.headers.get("Content-Type") || "";
    if (!response.ok || !type.startsWith("text/markdown")) return null;
    return await response.text();
  } catch {
    return null;
  }
}
