// The labextension's plugin: notebooks get back the run outputs a refresh lost.

import { INotebookTracker } from "@jupyterlab/notebook";

import { apiBase } from "./api.js";
import { restoreOutputs, shownRunIds } from "./restore.js";

/**
 * @typedef {import("@jupyterlab/application").JupyterFrontEnd} JupyterFrontEnd
 * @typedef {import("@jupyterlab/application").JupyterFrontEndPlugin<void>} Plugin
 * @typedef {import("@jupyterlab/notebook").NotebookPanel} NotebookPanel
 * @typedef {import("@jupyterlab/cells").ICodeCellModel} ICodeCellModel
 */

/**
 * Add the outputs of runs that cells of `panel` started after it was last saved.
 * @param {NotebookPanel} panel
 */
async function restorePanel(panel) {
  const context = panel.context;
  const notebook = panel.content.model;
  if (notebook === null) return;
  /** @type {Map<string, ICodeCellModel>} */
  const byId = new Map();
  const cells = [];
  for (const cell of notebook.cells) {
    const outputs = cell.type === "code" ? /** @type {ICodeCellModel} */ (cell).outputs : null;
    if (outputs !== null) byId.set(cell.id, /** @type {ICodeCellModel} */ (cell));
    const shown = outputs === null ? [] : Array.from({ length: outputs.length }, (_, i) => outputs.get(i).toJSON());
    cells.push({ id: cell.id, type: cell.type, runIds: shownRunIds(/** @type {any[]} */ (shown)) });
  }
  const restored = await restoreOutputs({
    fetch: (url, init) => fetch(url, init),
    baseUrl: apiBase(),
    path: context.path,
    lastModified: context.contentsModel ? context.contentsModel.last_modified : null,
    cells,
  });
  for (const { cellId, output } of restored) {
    const cell = byId.get(cellId);
    if (cell !== undefined) cell.outputs.add(/** @type {any} */ (output));
  }
}

/** @type {Plugin} */
const plugin = {
  id: "jupyter-agentruns:restore-outputs",
  description: "Brings back the outputs of agent runs that a refresh lost before the notebook was saved.",
  autoStart: true,
  requires: [INotebookTracker],
  /**
   * @param {JupyterFrontEnd} app
   * @param {import("@jupyterlab/notebook").INotebookTracker} tracker
   */
  activate(app, tracker) {
    tracker.widgetAdded.connect((_, panel) => {
      panel.context.ready
        .then(() => restorePanel(panel))
        .catch((error) => console.warn("agentruns: could not restore run outputs", error));
    });
  },
};

export default plugin;
