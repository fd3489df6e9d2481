// How the views ask for a run's page, and say that a run was deleted: DOM
// events on the document, so that a run view needs nothing of JupyterLab and
// works unchanged where no run pages exist.

/**
 * Sent (detail `{runId, edit?}`) when a person asks for a run's own page;
 * with `edit` (an edit id, or "" for the section), at its notebook edits.
 */
export const OPEN_RUN_EVENT = "agentruns:open-run";
/** Sent (detail `{runId}`) when a run's page deleted its run: lists drop it. */
export const RUN_DELETED_EVENT = "agentruns:run-deleted";

/** Whether something on this page opens run pages (the labextension says so on `<body>`). */
export function runPagesOpen() {
  return typeof document !== "undefined" && document.body !== null && document.body.dataset.agentrunsRunPages === "true";
}

/**
 * Ask for the page of `runId`, at one of its notebook edits (its id, or "" for all) if `edit` is given.
 * @param {string} runId
 * @param {string | null} [edit]
 */
export function requestRunPage(runId, edit = null) {
  document.dispatchEvent(new CustomEvent(OPEN_RUN_EVENT, { detail: edit === null ? { runId } : { runId, edit } }));
}

/** The query parameter of a link to a run's page in JupyterLab: `{base_url}lab?agentruns-run=<run id>`. */
export const RUN_PAGE_PARAM = "agentruns-run";

/**
 * The run a page's address asks for (`?agentruns-run=<id>`), and the query without it.
 * @param {string} search the address's query, with or without its `?`
 * @returns {{runId: string | null, rest: string}} `rest` is "" or a query starting with `?`
 */
export function runInAddress(search) {
  const runId = new URLSearchParams(search).get(RUN_PAGE_PARAM) || null;
  // The other parameters as they were written (URLSearchParams would rewrite `?reset` as `?reset=`).
  const kept = search
    .replace(/^\?/, "")
    .split("&")
    .filter((part) => part !== "" && part.split("=")[0] !== RUN_PAGE_PARAM);
  return { runId, rest: kept.length ? `?${kept.join("&")}` : "" };
}
