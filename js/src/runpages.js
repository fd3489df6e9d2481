// JupyterLab's side of a run's own page and of the runs table: the commands
// that open them in the main area, and the way to a run's cell.

import { ILabShell } from "@jupyterlab/application";
import { Widget } from "@lumino/widgets";

import { apiBase, pageOption } from "./api.js";
import { runsIcon } from "./icons.js";
import { RunsPanel } from "./panel.js";
import { OPEN_RUN_EVENT } from "./links.js";
import { RunPage } from "./runpage.js";
import { runTitle } from "./words.js";

/**
 * @typedef {import("@jupyterlab/application").JupyterFrontEnd} JupyterFrontEnd
 * @typedef {import("@jupyterlab/application").JupyterFrontEndPlugin<void>} Plugin
 * @typedef {import("@jupyterlab/notebook").NotebookPanel} NotebookPanel
 */

export const OPEN_RUN = "agentruns:open-run";
export const OPEN_TABLE = "agentruns:open-runs-table";
export const GO_TO_CELL = "agentruns:go-to-cell";

/** A run's page as a main-area tab. */
class RunPageWidget extends Widget {
  /** @param {RunPage} page */
  constructor(page) {
    super({ node: page.node });
    this.page = page;
    this.id = `jupyter-agentruns-run-${page.runId}`;
    this.addClass("agentruns-runpage-widget");
    this.title.label = page.runId;
    this.title.icon = runsIcon;
    this.title.caption = `Agent run ${page.runId}`;
    this.title.closable = true;
  }

  /**
   * Closing the tab ends the page (a closed Lumino widget is only detached):
   * it stops following its run, and the next open makes a new one.
   * @param {import("@lumino/messaging").Message} msg
   */
  onCloseRequest(msg) {
    super.onCloseRequest(msg);
    this.dispose();
  }

  dispose() {
    this.page.dispose();
    super.dispose();
  }
}

/** The runs panel as a main-area table, polling only while it is on screen. */
class RunsTableWidget extends Widget {
  /** @param {RunsPanel} panel */
  constructor(panel) {
    super({ node: panel.node });
    this.panel = panel;
    this.id = "jupyter-agentruns-runs-table";
    this.addClass("agentruns-table-widget");
    this.title.label = "Agent runs";
    this.title.icon = runsIcon;
    this.title.closable = true;
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

  /** @param {import("@lumino/messaging").Message} msg */
  onCloseRequest(msg) {
    super.onCloseRequest(msg);
    this.dispose();
  }

  dispose() {
    this.panel.dispose();
    super.dispose();
  }
}

/**
 * Open `path` and select the cell `cellId` there, scrolled into view.
 * @param {JupyterFrontEnd} app
 * @param {string} path
 * @param {string | null} cellId
 */
async function openCell(app, path, cellId) {
  const widget = /** @type {NotebookPanel | undefined} */ (await app.commands.execute("docmanager:open", { path }));
  if (!widget || cellId === null || !widget.context || !widget.content) return;
  await widget.context.ready;
  await widget.revealed;
  const notebook = widget.content;
  const index = notebook.widgets.findIndex((cell) => cell.model.id === cellId);
  if (index < 0) throw new Error(`it has no cell ${cellId} any more`);
  app.shell.activateById(widget.id);
  notebook.deselectAll();
  notebook.activeCellIndex = index;
  notebook.mode = "command";
  // Its top in view: a run's cell with its output is often taller than the window.
  await notebook.scrollToCell(notebook.widgets[index], "start");
  // A notebook just opened still draws outputs above the cell, which moves it:
  // once they are drawn (a moment later), scroll to it again.
  await new Promise((resolve) => setTimeout(resolve, 300));
  if (!notebook.isDisposed && notebook.activeCellIndex === index) await notebook.scrollToCell(notebook.widgets[index], "start");
}

/** @type {Plugin} */
export const runPagesPlugin = {
  id: "jupyter-agentruns:run-pages",
  description: "A run's own page and the table of runs, in the main area.",
  autoStart: true,
  // JupyterLab's tabs: Notebook 7 shows one document a page, and no run pages.
  optional: [ILabShell],
  /**
   * @param {JupyterFrontEnd} app
   * @param {import("@jupyterlab/application").ILabShell | null} labShell
   */
  activate(app, labShell) {
    if (labShell === null) return;
    /** @type {Map<string, RunPageWidget>} */
    const pages = new Map();
    /** @type {RunsTableWidget | null} */
    let table = null;
    const serverRoot = pageOption("agentrunsServerRoot") || pageOption("serverRoot");

    /** @param {string} runId */
    const openRun = (runId) => void app.commands.execute(OPEN_RUN, { run_id: runId });

    app.commands.addCommand(GO_TO_CELL, {
      label: "Go to the Cell of an Agent Run",
      caption: "Open a notebook at a cell: the one that started a run",
      async execute(args) {
        const path = typeof args.path === "string" ? args.path : "";
        if (!path) return;
        const cellId = typeof args.cell_id === "string" && args.cell_id ? args.cell_id : null;
        // A cell deleted since leaves the notebook open at its top.
        await openCell(app, path, cellId).catch(() => undefined);
      },
    });

    app.commands.addCommand(OPEN_RUN, {
      label: "Open Agent Run",
      caption: "Open a run's own page: its timeline, answer, attempts and cell",
      execute(args) {
        const runId = typeof args.run_id === "string" ? args.run_id : "";
        if (!runId) return;
        let widget = pages.get(runId);
        if (widget === undefined || widget.isDisposed) {
          const page = new RunPage({
            baseUrl: apiBase(),
            runId,
            openRun,
            openCell: (path, cellId) => openCell(app, path, cellId),
          });
          const made = new RunPageWidget(page);
          widget = made;
          pages.set(runId, made);
          made.disposed.connect(() => pages.delete(runId));
          void page.load().then(() => {
            if (page.run !== null) made.title.label = runTitle(page.run) || runId;
          });
          app.shell.add(made, "main");
        }
        app.shell.activateById(widget.id);
        return widget;
      },
    });

    app.commands.addCommand(OPEN_TABLE, {
      label: "Open Agent Runs Table",
      caption: "The runs, as a table in the main area",
      execute() {
        if (table === null || table.isDisposed) {
          const panel = new RunsPanel({
            baseUrl: apiBase(),
            serverRoot,
            layout: "table",
            openPath: (path) => void app.commands.execute("docmanager:open", { path }),
            openRun,
          });
          table = new RunsTableWidget(panel);
          app.shell.add(table, "main");
        }
        app.shell.activateById(table.id);
        return table;
      },
    });

    // A run view (in a notebook, or on a run's page) asks for a run's page
    // with a DOM event: it knows nothing of JupyterLab.
    document.body.dataset.agentrunsRunPages = "true";
    document.addEventListener(OPEN_RUN_EVENT, (event) => {
      const runId = /** @type {CustomEvent} */ (event).detail?.runId;
      if (typeof runId === "string" && runId) openRun(runId);
    });
  },
};
