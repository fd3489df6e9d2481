// The labextension's renderer of run outputs (application/vnd.jupyter.agentruns.run+json).
//
// It outranks the ipywidgets view, so every run output renders here, live
// from the server, whether or not a kernel and its widget model exist. When
// the widget model of the run is in this page, the renderer keeps it in sync
// as the widget's own view would. It also keeps the notebook's record of the
// run current once the run has ended, and as the follow-ups under it end.

import { Widget } from "@lumino/widgets";

import { apiBase, apiFetch, runsUrl } from "./api.js";
import { findModel, watchModels } from "./models.js";
import { MIME_TYPE, fetchRecord, runData, switchedBundle, updatedBundle } from "./record.js";
import { writesOutputs } from "./shared.js";
import { RunView, followNewRun, syncFor, tellThread } from "./view.js";

/**
 * @typedef {import("@jupyterlab/rendermime-interfaces").IRenderMime.IMimeModel} IMimeModel
 * @typedef {import("@jupyterlab/rendermime-interfaces").IRenderMime.IRendererFactory} IRendererFactory
 * @typedef {import("@jupyterlab/rendermime-interfaces").IRenderMime.IExtension} IExtension
 * @typedef {import("./runstate.js").RunState} RunState
 * @typedef {import("./runstate.js").Run} Run
 * @typedef {import("./view.js").RunHost} RunHost
 */

/**
 * Lower ranks win. ipywidgets' widget view has -10 (0 in older releases):
 * a run output must show through this renderer, which needs no kernel.
 */
export const RANK = -20;

/** Renders one run output. */
export class RunRenderer extends Widget {
  constructor() {
    super();
    this.addClass("agentruns-renderer");
    /** @type {IMimeModel | null} */
    this.mimeModel = null;
    /** @type {string} the run the output names */
    this.outputRunId = "";
    /** @type {Set<() => void>} */
    this.callbacks = new Set();
    /** @type {() => void} */
    this.unwatch = () => {};
    /** @type {string | null} the run and ended follow-ups whose record was checked (or is being checked) */
    this.recordChecked = null;
    /** @type {RunState | null} the run as last shown */
    this.shownState = null;
    /** @type {string[]} the follow-ups under it that have ended, as last shown */
    this.threadEnded = [];
    this.view = new RunView(this._host(), this.node);
  }

  /**
   * Called for the first rendering and again whenever the output's data changes
   * (this renderer's own setData included): only a new run id re-attaches.
   * @param {IMimeModel} model
   * @returns {Promise<void>}
   */
  async renderModel(model) {
    this.mimeModel = model;
    const data = runData(/** @type {Record<string, any>} */ (model.data));
    const runId = data ? data.run_id : "";
    if (runId === this.outputRunId) return;
    this.outputRunId = runId;
    this.recordChecked = null;
    this.shownState = null;
    this.threadEnded = [];
    this.unwatch();
    this.unwatch = watchModels(runId, () => this._notify());
    this.view.attach(runId);
  }

  dispose() {
    if (this.isDisposed) return;
    this.unwatch();
    this.view.dispose();
    super.dispose();
  }

  _notify() {
    for (const callback of [...this.callbacks]) callback();
  }

  /** @returns {RunHost} */
  _host() {
    const model = () => findModel(this.outputRunId);
    return {
      runId: () => this.outputRunId,
      baseUrl: () => {
        const found = model();
        return found ? found.get("base_url") || null : null;
      },
      reattached: () => Boolean(model()?.get("reattached")),
      followed: () => String(model()?.get("followed") || ""),
      savedRecord: () => {
        const record = this.mimeModel ? this.mimeModel.data["text/markdown"] : null;
        return typeof record === "string" ? record : null;
      },
      subscribe: (callback) => {
        this.callbacks.add(callback);
        return () => this.callbacks.delete(callback);
      },
      save: (runId, lastSeq, status, now) => {
        const found = model();
        if (found) syncFor(found).save(runId, lastSeq, status, now);
      },
      ranAgain: (run, previous) => this._ranAgain(run, previous),
      shown: (state) => {
        this.shownState = state;
        void this._checkRecord();
      },
      threadEnded: (runIds) => {
        this.threadEnded = runIds;
        // The kernel, where it lives, keeps its copy of the record too (and in a shared
        // notebook it alone changes the output: see _checkRecord).
        const found = model();
        if (found) tellThread(found, runIds);
        void this._checkRecord();
      },
    };
  }

  /**
   * Run again: the kernel's model (if any) and the saved output both move to the new run.
   * @param {Run} run
   * @param {string} previous
   */
  async _ranAgain(run, previous) {
    const model = findModel(previous);
    if (model) followNewRun(model, run);
    const record = await fetchRecord(apiFetch, runsUrl(apiBase(), run.run_id));
    const mimeModel = this.mimeModel;
    if (mimeModel === null || this.isDisposed) return;
    const fields = { run_id: run.run_id, status: run.status, last_seq: run.last_seq, agent: run.agent };
    mimeModel.setData({ data: switchedBundle(/** @type {Record<string, any>} */ (mimeModel.data), fields, record) });
    // An output that is not in a notebook (no setData effect) still follows the new run.
    if (this.outputRunId !== run.run_id) void this.renderModel(mimeModel);
  }

  /**
   * Once the run has ended, bring the output's record up to date: again each
   * time another follow-up under it ends (the server's record holds the
   * thread), and only if it changed. The record is the server's whole text
   * each time, never added to: a refresh cannot repeat a follow-up in it.
   */
  async _checkRecord() {
    const state = this.shownState;
    if (state === null || !state.terminal || state.run === null) return;
    const key = [state.runId, ...this.threadEnded].join(" ");
    if (this.recordChecked === key) return;
    this.recordChecked = key;
    const record = await fetchRecord(apiFetch, runsUrl(apiBase(), state.runId));
    const mimeModel = this.mimeModel;
    // A newer check (another follow-up ended meanwhile) has the newer record.
    if (mimeModel === null || this.isDisposed || this.outputRunId !== state.runId || this.recordChecked !== key) return;
    // In a shared document every page holding it would make this change, each its own copy of
    // the output: one page makes it, and the others get it through the document. None does
    // where the run's kernel is alive (its widget model is in this page): the kernel does.
    if (!writesOutputs(this.node, findModel(state.runId) !== null)) return;
    const fields = { run_id: state.runId, status: state.status, last_seq: state.lastSeq, agent: state.run.agent };
    const next = updatedBundle(/** @type {Record<string, any>} */ (mimeModel.data), fields, record);
    if (next !== null) mimeModel.setData({ data: next });
  }
}

/** @type {IRendererFactory} */
export const rendererFactory = {
  safe: true,
  mimeTypes: [MIME_TYPE],
  defaultRank: RANK,
  createRenderer: () => new RunRenderer(),
};

/** @type {IExtension} */
const extension = {
  id: "jupyter-agentruns:renderer",
  rendererFactory,
  rank: RANK,
  dataType: "json",
};

export default extension;
