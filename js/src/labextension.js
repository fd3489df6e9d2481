// The labextension's plugins: notebooks get back the run outputs a refresh
// lost, and the left sidebar gets the runs panel, with toasts, a status-bar
// item and a badge on its tab when a run needs the person.

import { Notification } from "@jupyterlab/apputils";
import { INotebookTracker } from "@jupyterlab/notebook";
import { ISettingRegistry } from "@jupyterlab/settingregistry";
import { IStatusBar } from "@jupyterlab/statusbar";
import { Widget } from "@lumino/widgets";

import { apiBase, apiFetch, pageOption } from "./api.js";
import { RunWatch } from "./attention.js";
import { runsIcon } from "./icons.js";
import { Attention } from "./notify.js";
import { RunsPanel, contentsPath } from "./panel.js";
import { restoreOutputs, shownRunIds } from "./restore.js";
import { GO_TO_CELL, OPEN_RUN, OPEN_TABLE, runPagesPlugin } from "./runpages.js";

/**
 * @typedef {import("@jupyterlab/application").JupyterFrontEnd} JupyterFrontEnd
 * @typedef {import("@jupyterlab/application").JupyterFrontEndPlugin<void>} Plugin
 * @typedef {import("@jupyterlab/notebook").NotebookPanel} NotebookPanel
 * @typedef {import("@jupyterlab/cells").ICodeCellModel} ICodeCellModel
 */

const SHOW_RUNS = "jupyter-agentruns:show-runs";

/**
 * Add the outputs of runs that cells of `panel` started after it was last
 * saved, and tell of the runs whose cells are not in the saved notebook.
 * @param {JupyterFrontEnd} app
 * @param {NotebookPanel} panel
 */
async function restorePanel(app, panel) {
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
    cells.push({ id: cell.id, type: cell.type, runIds: shownRunIds(/** @type {any[]} */ (shown)), source: cell.sharedModel.getSource() });
  }
  const { restored, gone } = await restoreOutputs({
    fetch: apiFetch,
    baseUrl: apiBase(),
    path: context.path,
    lastModified: context.contentsModel ? context.contentsModel.last_modified : null,
    cells,
  });
  for (const { cellId, outputs } of restored) {
    const cell = byId.get(cellId);
    if (cell !== undefined) for (const output of outputs) cell.outputs.add(/** @type {any} */ (output));
  }
  if (gone.length > 0) goneNotice(app, context.path, gone);
}

/**
 * One notice for the runs whose cells the saved notebook does not have, with a way to see them.
 * @param {JupyterFrontEnd} app
 * @param {string} path
 * @param {import("./runstate.js").Run[]} runs
 */
function goneNotice(app, path, runs) {
  const name = path.split("/").pop() || path;
  const count = runs.length === 1 ? "1 run" : `${runs.length} runs`;
  const message = `${count} of ${name} came from cells that are not in the saved notebook (never saved, or deleted).`;
  const session = runs.find((run) => typeof run.session === "string" && run.session)?.session ?? null;
  /** @type {import("@jupyterlab/apputils").Notification.IAction[]} */
  const actions = [];
  if (app.commands.hasCommand(SHOW_RUNS)) {
    actions.push({
      label: "Show in the runs panel",
      caption: "List them in the runs panel, marked",
      callback: () => void app.commands.execute(SHOW_RUNS, { session, runIds: runs.map((run) => run.run_id) }),
    });
  }
  Notification.warning(message, { autoClose: false, actions });
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
    // A run view's "Insert as cell": the code goes into a new cell below the run's cell.
    document.addEventListener("agentruns:insert-cell", (event) => {
      const asked = /** @type {CustomEvent<{code: string}>} */ (event);
      const target = /** @type {Node} */ (asked.target);
      const panel = tracker.find((candidate) => candidate.node.contains(target));
      const model = panel ? panel.content.model : null;
      if (!panel || model === null || typeof asked.detail?.code !== "string") return;
      const index = panel.content.widgets.findIndex((cell) => cell.node.contains(target));
      model.sharedModel.insertCell(index + 1, { cell_type: "code", source: asked.detail.code });
      asked.preventDefault();
    });
    tracker.widgetAdded.connect((_, panel) => {
      panel.context.ready
        .then(() => restorePanel(app, panel))
        .catch((error) => console.warn("agentruns: could not restore run outputs", error));
    });
  },
};

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

const PANEL_PLUGIN_ID = "jupyter-agentruns:runs-panel";

/** @type {import("@jupyterlab/application").JupyterFrontEndPlugin<void>} */
const panelPlugin = {
  id: PANEL_PLUGIN_ID,
  description:
    "A sidebar listing your agent runs, live, with cancel, run again and answers to questions; " +
    "toasts, a status-bar item and a badge when a run needs you.",
  autoStart: true,
  optional: [ISettingRegistry, IStatusBar, INotebookTracker],
  /**
   * @param {JupyterFrontEnd} app
   * @param {ISettingRegistry | null} settingRegistry
   * @param {IStatusBar | null} statusBar
   * @param {import("@jupyterlab/notebook").INotebookTracker | null} tracker
   */
  activate(app, settingRegistry, statusBar, tracker) {
    const serverRoot = pageOption("agentrunsServerRoot") || pageOption("serverRoot");
    /** @param {any} run */
    const notebookPath = (run) => (typeof run.session === "string" && run.session ? contentsPath(run.session, serverRoot) : null);
    const panel = new RunsPanel({
      baseUrl: apiBase(),
      serverRoot,
      openPath: (path) => void app.commands.execute("docmanager:open", { path }),
      // Where run pages exist (JupyterLab, not Notebook 7).
      openRun: (runId) => void (app.commands.hasCommand(OPEN_RUN) && app.commands.execute(OPEN_RUN, { run_id: runId })),
      openTable: () => void (app.commands.hasCommand(OPEN_TABLE) && app.commands.execute(OPEN_TABLE)),
    });
    // Notebook 7 has a left area too (View > Left Sidebar); JupyterLab shows the tab.
    const tab = new RunsPanelWidget(panel);
    app.shell.add(tab, "left", { rank: 900 });

    app.commands.addCommand(SHOW_RUNS, {
      label: "Show agent runs in the runs panel",
      execute: (args) => {
        app.shell.activateById(tab.id);
        const runIds = Array.isArray(args.runIds) ? args.runIds.map(String) : [];
        void panel.showRuns(typeof args.session === "string" ? args.session : null, runIds);
      },
    });

    const watch = new RunWatch({ baseUrl: apiBase() });
    const attention = new Attention({
      watch,
      tab,
      openPanel: () => app.shell.activateById(tab.id),
      openNotebook: (run) => {
        const path = notebookPath(run);
        if (path === null) return false;
        const cellId = run.metadata && typeof run.metadata.cell_id === "string" ? run.metadata.cell_id : null;
        // At the run's cell where JupyterLab's run pages are (not in Notebook 7).
        if (cellId !== null && app.commands.hasCommand(GO_TO_CELL)) {
          void app.commands.execute(GO_TO_CELL, { path, cell_id: cellId });
        } else {
          void app.commands.execute("docmanager:open", { path });
        }
        return true;
      },
      // The person sees the run's notebook: the page is visible and the notebook is the current one.
      inView: (run) => {
        const path = notebookPath(run);
        const current = tracker ? tracker.currentWidget : null;
        return (
          path !== null &&
          document.visibilityState === "visible" &&
          current !== null &&
          current.isVisible &&
          current.context.path === path
        );
      },
    });
    if (statusBar) {
      statusBar.registerStatusItem("jupyter-agentruns:run-counts", {
        item: attention.statusItem,
        align: "left",
        rank: 900,
        isActive: () => attention.statusItem.active,
        activeStateChanged: attention.statusItem.activeStateChanged,
      });
    }
    if (settingRegistry) {
      settingRegistry
        .load(PANEL_PLUGIN_ID)
        .then((settings) => {
          attention.configure(/** @type {any} */ (settings.composite));
          settings.changed.connect(() => attention.configure(/** @type {any} */ (settings.composite)));
        })
        .catch((error) => console.warn("agentruns: could not read the settings; using the defaults", error))
        .finally(() => watch.start());
    } else {
      watch.start();
    }
  },
};

export default [restorePlugin, panelPlugin, runPagesPlugin];
