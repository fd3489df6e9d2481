// How the views ask for a run's page, and say that a run was deleted: DOM
// events on the document, so that a run view needs nothing of JupyterLab and
// works unchanged where no run pages exist.

/** Sent (detail `{runId}`) when a person asks for a run's own page. */
export const OPEN_RUN_EVENT = "agentruns:open-run";
/** Sent (detail `{runId}`) when a run's page deleted its run: lists drop it. */
export const RUN_DELETED_EVENT = "agentruns:run-deleted";

/** Whether something on this page opens run pages (the labextension says so on `<body>`). */
export function runPagesOpen() {
  return typeof document !== "undefined" && document.body !== null && document.body.dataset.agentrunsRunPages === "true";
}

/**
 * Ask for the page of `runId`.
 * @param {string} runId
 */
export function requestRunPage(runId) {
  document.dispatchEvent(new CustomEvent(OPEN_RUN_EVENT, { detail: { runId } }));
}
