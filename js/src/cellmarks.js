// JupyterLab's side of the cells' marks: every cell of an open notebook that
// carries an agent's stamp (`metadata.agentruns`) shows which agent wrote it,
// and the mark follows the stamp as cells come and go and their metadata
// changes (an undo takes the stamp away, and the mark with it).

import { INotebookTracker } from "@jupyterlab/notebook";

import { apiBase } from "./api.js";
import { runPagesOpen, requestRunPage } from "./links.js";
import { AgentNames, cellStamp, markNode, showAgent } from "./provenance.js";

/**
 * @typedef {import("@jupyterlab/application").JupyterFrontEnd} JupyterFrontEnd
 * @typedef {import("@jupyterlab/application").JupyterFrontEndPlugin<void>} Plugin
 * @typedef {import("@jupyterlab/notebook").NotebookPanel} NotebookPanel
 * @typedef {import("@jupyterlab/cells").Cell} Cell
 * @typedef {import("@jupyterlab/cells").ICellModel} ICellModel
 */

const MARKED = "agentruns-cell--marked";

/**
 * Give `cell` the mark its stamp asks for: none, or one naming the run's agent.
 * @param {Cell} cell
 * @param {AgentNames} names
 */
function markCell(cell, names) {
  const stamp = cellStamp({ agentruns: cell.model.getMetadata("agentruns") });
  const shown = /** @type {HTMLElement | null} */ (cell.node.querySelector(":scope > .agentruns-cell-mark"));
  if (stamp === null) {
    shown?.remove();
    cell.removeClass(MARKED);
    return;
  }
  if (shown !== null && shown.dataset.runId === stamp.runId && shown.dataset.editId === (stamp.editId ?? "")) return;
  shown?.remove();
  // A click opens the run's page at the edit that stamped the cell.
  const mark = markNode(stamp, runPagesOpen() ? (runId) => requestRunPage(runId, stamp.editId ?? "") : null);
  // Under the cell's input, at the editor's edge, before its outputs: the cell's toolbar keeps its corner.
  const input = cell.node.querySelector(":scope > .jp-Cell-inputWrapper");
  if (input === null) return; // drawn once the cell is (see markNotebook)
  input.after(mark);
  cell.addClass(MARKED);
  void names.agent(stamp.runId).then((agent) => showAgent(mark, stamp, agent));
}

/**
 * Mark the cells of `panel`, and keep them marked as its cells and their metadata change.
 * @param {NotebookPanel} panel
 * @param {AgentNames} names
 */
function markNotebook(panel, names) {
  const notebook = panel.content;
  /** @type {WeakSet<ICellModel>} */
  const watched = new WeakSet();
  /** @param {ICellModel} model */
  const markModel = (model) => {
    const cell = notebook.widgets.find((widget) => widget.model === model);
    if (cell !== undefined) markCell(cell, names);
  };
  const markAll = () => {
    if (notebook.isDisposed) return;
    for (const cell of notebook.widgets) {
      if (!watched.has(cell.model)) {
        watched.add(cell.model);
        cell.model.metadataChanged.connect((model) => markModel(/** @type {ICellModel} */ (model)));
      }
      // A cell out of sight may be a placeholder, its input not drawn yet.
      if (cell.isPlaceholder()) void cell.ready.then(() => markCell(cell, names));
      else markCell(cell, names);
    }
  };
  // The notebook makes a new cell's widget on the same signal: the marks come after.
  const later = () => void Promise.resolve().then(markAll);
  /** @type {import("@jupyterlab/notebook").INotebookModel | null} */
  let model = null;
  const follow = () => {
    model?.cells.changed.disconnect(later);
    model = notebook.model;
    model?.cells.changed.connect(later);
    later();
  };
  notebook.modelChanged.connect(follow);
  follow();
}

/** @type {Plugin} */
export const cellMarksPlugin = {
  id: "jupyter-agentruns:cell-marks",
  description: "Marks each notebook cell an agent wrote with the agent's name and a way to its run.",
  autoStart: true,
  requires: [INotebookTracker],
  /**
   * @param {JupyterFrontEnd} _app
   * @param {import("@jupyterlab/notebook").INotebookTracker} tracker
   */
  activate(_app, tracker) {
    const names = new AgentNames({ baseUrl: apiBase() });
    tracker.forEach((panel) => markNotebook(panel, names));
    tracker.widgetAdded.connect((_, panel) => markNotebook(panel, names));
  },
};
