// The labextension's plugins: notebooks get back the run outputs a refresh
// lost, and the left sidebar gets the runs panel.

import { INotebookTracker } from "@jupyterlab/notebook";
import { LabIcon } from "@jupyterlab/ui-components";
import { Widget } from "@lumino/widgets";

import { apiBase, pageOption } from "./api.js";
import { RunsPanel } from "./panel.js";
import { restoreOutputs, shownRunIds } from "./restore.js";
import { OPEN_RUN, OPEN_TABLE, runPagesPlugin } from "./runpages.js";

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
const restorePlugin = {
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

// A play button in a circle: runs, in the sidebar's size and colour.
const runsIcon = new LabIcon({
  name: "jupyter-agentruns:runs",
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 24 24">' +
    '<g class="jp-icon3" fill="#616161"><path d="M12 2a10 10 0 1 0 0 20 10 10 0 0 0 0-20zm0 2a8 8 0 1 1 0 16 8 8 0 0 1 0-16z"/>' +
    '<path d="M10 8v8l6-4z"/></g></svg>',
});

/** The panel as a Lumino widget: polling only while it is on screen. */
class RunsPanelWidget extends Widget {
  /** @param {RunsPanel} panel */
  constructor(panel) {
    super({ node: panel.node });
    this.panel = panel;
    this.id = "jupyter-agentruns-runs";
    this.addClass("agentruns-panel-widget");
    this.title.icon = runsIcon;
    this.title.caption = "Agent runs";
  }

  onAfterShow() {
    this.panel.show();
  }

  onAfterAttach() {
    if (this.isVisible) this.panel.show();
  }

  onBeforeHide() {
    this.panel.hide();
  }

  onBeforeDetach() {
    this.panel.hide();
  }

  dispose() {
    this.panel.dispose();
    super.dispose();
  }
}

/** @type {Plugin} */
const panelPlugin = {
  id: "jupyter-agentruns:runs-panel",
  description: "A sidebar listing your agent runs, live, with cancel, run again and answers to questions.",
  autoStart: true,
  /** @param {JupyterFrontEnd} app */
  activate(app) {
    const panel = new RunsPanel({
      baseUrl: apiBase(),
      serverRoot: pageOption("agentrunsServerRoot") || pageOption("serverRoot"),
      openPath: (path) => void app.commands.execute("docmanager:open", { path }),
      // Where run pages exist (JupyterLab, not Notebook 7).
      openRun: (runId) => void (app.commands.hasCommand(OPEN_RUN) && app.commands.execute(OPEN_RUN, { run_id: runId })),
      openTable: () => void (app.commands.hasCommand(OPEN_TABLE) && app.commands.execute(OPEN_TABLE)),
    });
    // Notebook 7 has a left area too (View > Left Sidebar); JupyterLab shows the tab.
    app.shell.add(new RunsPanelWidget(panel), "left", { rank: 900 });
  },
};

export default [restorePlugin, panelPlugin, runPagesPlugin];
