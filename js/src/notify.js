// Where a run reaches the person in JupyterLab and Notebook 7: toasts
// (JupyterLab's notifications), a status-bar item and a badge on the runs
// panel's tab, each of which a setting turns off. What they say comes from
// the page's RunWatch (attention.js).

import { Notification } from "@jupyterlab/apputils";
import { Signal } from "@lumino/signaling";
import { Widget } from "@lumino/widgets";

import { countWords, endedToast, endedWords, questionChoices, questionWords } from "./attention.js";
import { choicesAsList } from "./dom.js";

/**
 * @typedef {import("./attention.js").RunWatch} RunWatch
 * @typedef {import("./attention.js").Counts} Counts
 * @typedef {{
 *   notifyQuestions: boolean, notifyFailures: boolean, notifyLongRuns: boolean,
 *   statusBar: boolean, tabBadge: boolean,
 * }} AttentionSettings
 * @typedef {{
 *   watch: RunWatch,
 *   tab: Widget,
 *   openPanel: () => void,
 *   openNotebook: (run: any) => boolean,
 *   inView: (run: any) => boolean,
 * }} AttentionOptions
 */

/** @type {AttentionSettings} what the settings schema says when nothing is set */
export const DEFAULT_SETTINGS = {
  notifyQuestions: true,
  notifyFailures: true,
  notifyLongRuns: true,
  statusBar: true,
  tabBadge: true,
};

/** The tab's attribute data-agentruns-waiting (Lumino writes dataset keys as they are). */
const BADGE = "agentruns-waiting";

/** How long a toast about a run that ended stays (ms); a question stays until it is answered. */
const ENDED_TOAST_MS = 15_000;

/** The status-bar item: the counts of active runs; a click opens the runs panel. */
export class RunCountItem extends Widget {
  /** @param {() => void} open */
  constructor(open) {
    super({ node: document.createElement("button") });
    this.addClass("agentruns-status-item");
    this.addClass("jp-StatusBar-TextItem");
    this.node.title = "Agent runs: open the runs panel";
    this.node.addEventListener("click", open);
    // The status bar shows and hides its items itself, asking isActive() on this signal.
    /** @type {Signal<RunCountItem, void>} */
    this.activeStateChanged = new Signal(this);
    this.active = false;
    this.setCounts({ running: 0, waiting: 0 }, true);
  }

  /**
   * @param {Counts} counts
   * @param {boolean} enabled
   */
  setCounts(counts, enabled) {
    const words = countWords(counts);
    this.node.textContent = `Agent runs: ${words}`;
    this.node.dataset.running = String(counts.running);
    this.node.dataset.waiting = String(counts.waiting);
    this.node.classList.toggle("agentruns-status-item--waiting", counts.waiting > 0);
    const active = enabled && words !== "";
    if (active !== this.active) {
      this.active = active;
      this.activeStateChanged.emit(undefined);
    }
  }
}

export class Attention {
  /** @param {AttentionOptions} options */
  constructor(options) {
    this.watch = options.watch;
    this.tab = options.tab;
    this.openPanel = options.openPanel;
    this.openNotebook = options.openNotebook;
    this.inView = options.inView;
    /** @type {AttentionSettings} */
    this.settings = { ...DEFAULT_SETTINGS };
    /** @type {Map<string, string>} "runId/requestId" -> the question's toast */
    this.questionToasts = new Map();
    this.statusItem = new RunCountItem(() => this.openPanel());
    this.stopListening = this.watch.listen({
      onCounts: () => this.render(),
      onQuestion: (run, input) => this.question(run, input),
      onResolved: (runId, requestId) => this.resolved(runId, requestId),
      onEnded: (run, state, durationMs) => this.ended(run, state, durationMs),
    });
  }

  /** @param {Partial<AttentionSettings>} values */
  configure(values) {
    /** @type {any} */
    const settings = { ...DEFAULT_SETTINGS };
    for (const name of Object.keys(DEFAULT_SETTINGS)) {
      const value = /** @type {any} */ (values)[name];
      if (typeof value === "boolean") settings[name] = value;
    }
    this.settings = settings;
    if (!this.settings.notifyQuestions) {
      for (const id of this.questionToasts.values()) Notification.dismiss(id);
      this.questionToasts.clear();
    }
    this.render();
  }

  /** The counts, in the status bar and on the panel's tab. */
  render() {
    const counts = this.watch.counts;
    this.statusItem.setCounts(counts, this.settings.statusBar);
    const title = this.tab.title;
    const badge = this.settings.tabBadge && counts.waiting > 0 ? String(counts.waiting) : null;
    if ((title.dataset[BADGE] ?? null) !== badge) {
      // The shell keeps the tab's id in the same dataset.
      const kept = { ...title.dataset };
      delete kept[BADGE];
      title.dataset = badge === null ? kept : { ...kept, [BADGE]: badge };
    }
    title.caption = counts.waiting > 0
      ? `Agent runs: ${counts.waiting} waiting for an answer`
      : "Agent runs";
  }

  /**
   * @param {any} run
   * @param {any} input
   */
  question(run, input) {
    if (!this.settings.notifyQuestions) return;
    const runId = String(run.run_id);
    const requestId = String(input.request_id);
    const key = `${runId}/${requestId}`;
    const choices = questionChoices(input);
    // Many choices, or long ones, are not a toast's row of buttons: the panel and the notebook list them.
    const listed = choicesAsList(choices.map(([, label]) => label));
    /** @type {Notification.IAction[]} */
    const actions = (listed ? [] : choices).map(([choice, label], index) => ({
      label,
      caption: `Answer "${label}"`,
      displayType: index === 0 ? "accent" : "default",
      callback: (event) => {
        // The toast goes once the answer is taken (the run says so), not on the click.
        event.preventDefault();
        void this.watch.answer(runId, requestId, choice).then((problem) => {
          if (problem === null) this.resolved(runId, requestId);
          else Notification.error(`The answer was not taken: ${problem}`, { autoClose: ENDED_TOAST_MS });
        });
      },
    }));
    const show = listed ? `Show its ${choices.length} choices` : "Show";
    actions.push({ label: show, caption: "Open the notebook of this run, or the runs panel", displayType: "link", callback: () => this.show(run) });
    const id = Notification.warning(questionWords(run, input), { autoClose: false, actions });
    this.questionToasts.set(key, id);
  }

  /**
   * @param {string} runId
   * @param {string} requestId
   */
  resolved(runId, requestId) {
    const key = `${runId}/${requestId}`;
    const id = this.questionToasts.get(key);
    if (id === undefined) return;
    this.questionToasts.delete(key);
    Notification.dismiss(id);
  }

  /**
   * @param {any} run
   * @param {import("./runstate.js").RunState} state
   * @param {number | null} durationMs
   */
  ended(run, state, durationMs) {
    const kind = endedToast(state, durationMs, this.settings, this.inView(run));
    if (kind === null) return;
    const actions = [{ label: "Show", caption: "Open the notebook of this run, or the runs panel", callback: () => this.show(run) }];
    Notification[kind](endedWords(run, state, durationMs), { autoClose: ENDED_TOAST_MS, actions });
  }

  /** @param {any} run */
  show(run) {
    if (!this.openNotebook(run)) this.openPanel();
  }

  dispose() {
    this.stopListening();
    for (const id of this.questionToasts.values()) Notification.dismiss(id);
    this.questionToasts.clear();
    this.statusItem.dispose();
  }
}
