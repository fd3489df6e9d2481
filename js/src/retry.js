// "Retry from here" on a step of an ended run: a fork (POST runs/{id}/fork) that goes on from
// the state before the step, with the prompt as the person edits it.

import { apiFetch, errorMessage, runsUrl } from "./api.js";
import { button, element } from "./dom.js";
import { UNREACHABLE } from "./actions.js";

/**
 * @typedef {import("./actions.js").RunActions} RunActions
 * @typedef {import("./actions.js").Outcome} Outcome
 * @typedef {import("./api.js").Fetch} Fetch
 */

// Events read a request at a time while the step's event is looked for.
const PAGE = 1000;

/**
 * The seqs of the run's `tool.started` events (each starts a step), in order, read a page at
 * a time: the first `count` of them, or those up to the event `upto`.
 * @param {string} baseUrl
 * @param {string} runId
 * @param {{count?: number, upto?: number}} until
 * @param {Fetch} [fetch]
 * @returns {Promise<number[]>}
 */
export async function stepStarts(baseUrl, runId, { count = Infinity, upto = Infinity }, fetch = apiFetch) {
  /** @type {number[]} */
  const starts = [];
  let after = 0;
  while (starts.length < count && after < upto) {
    const limit = Math.min(PAGE, upto - after);
    const response = await fetch(`${runsUrl(baseUrl, runId)}/events?after=${after}&limit=${limit}`);
    if (!response.ok) throw new Error(await errorMessage(response));
    const page = await response.json();
    /** @type {{seq: number, type: string}[]} */
    const events = Array.isArray(page.events) ? page.events : [];
    for (const event of events) {
      if (event.type === "tool.started" && event.seq <= upto && starts.length < count) starts.push(event.seq);
    }
    if (events.length === 0 || page.done) break;
    after = events[events.length - 1].seq;
  }
  return starts;
}

/**
 * The seq of the event that started the run's `index`-th step (its `tool.started`), or null.
 * @param {string} baseUrl
 * @param {string} runId
 * @param {number} index
 * @param {Fetch} [fetch]
 * @returns {Promise<number | null>}
 */
export async function stepSeq(baseUrl, runId, index, fetch = apiFetch) {
  const starts = await stepStarts(baseUrl, runId, { count: index + 1 }, fetch);
  return starts.length > index ? starts[index] : null;
}

/**
 * The form under a step: the prompt to edit (when the run's input has one), Retry and Cancel.
 * `started(run)` is told of the new run; the form says what went wrong otherwise.
 * @param {{runId: string, index: number, input: any, baseUrl: string, actions: RunActions,
 *   started: (run: any) => void, close: () => void, fetch?: Fetch}} options
 * @returns {HTMLElement}
 */
export function retryForm(options) {
  const { runId, index, input, baseUrl, actions, started, close } = options;
  const form = element("div", "agentruns-retry-form");
  const prompt = typeof input?.prompt === "string" ? input.prompt : null;
  const text = /** @type {HTMLTextAreaElement} */ (element("textarea", "agentruns-retry-prompt"));
  text.setAttribute("aria-label", "The prompt of the retry");
  text.rows = 3;
  text.value = prompt ?? "";
  text.hidden = prompt === null;
  // Its keys are the box's, not the notebook's shortcuts.
  text.addEventListener("keydown", (event) => event.stopPropagation());
  const go = button("Retry", "agentruns-retry-go");
  go.title = "Start a new run from before this step, with this prompt";
  const cancel = button("Cancel", "agentruns-retry-cancel");
  const note = element("span", "agentruns-retry-note");
  note.setAttribute("role", "status");
  cancel.addEventListener("click", close);
  go.addEventListener("click", async () => {
    go.disabled = true;
    note.textContent = "Starting…";
    try {
      const seq = await stepSeq(baseUrl, runId, index, options.fetch);
      if (seq === null) {
        note.textContent = "Retry failed: this step's events are no longer kept.";
        return;
      }
      const fields = prompt !== null && text.value !== prompt ? { prompt: text.value } : {};
      const outcome = await actions.fork(runId, seq - 1, fields);
      if (outcome.problem !== null) {
        note.textContent = `Retry failed: ${outcome.problem}`;
        return;
      }
      note.textContent = `Started ${outcome.run.run_id}`;
      started(outcome.run);
    } catch (error) {
      note.textContent = `Retry failed: ${error instanceof Error && error.message ? error.message : UNREACHABLE}`;
    } finally {
      go.disabled = false;
    }
  });
  const buttons = element("div", "agentruns-retry-buttons");
  buttons.append(go, cancel, note);
  const hint = element(
    "div",
    "agentruns-retry-hint",
    prompt === null ? "A new run from before this step: what came before it is kept." : "A new run from before this step, with this prompt: what came before it is kept."
  );
  form.append(hint, text, buttons);
  return form;
}
