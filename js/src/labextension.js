// The labextension's plugins: notebooks get back the run outputs a refresh
// lost, and the left sidebar gets the runs panel, with toasts, a status-bar
// item and a badge on its tab when a run needs the person; the cells agents
// wrote are marked (cellmarks.js); an agent's edit of a notebook open in the
// page is made on the page's model; a cell's context menu asks an agent about it;
// a %%agent cell's prompt is shown as Markdown (agentcells.js).

import { Dialog, ICommandPalette, Notification } from "@jupyterlab/apputils";
import { IEditorLanguageRegistry } from "@jupyterlab/codemirror";
import { INotebookTracker } from "@jupyterlab/notebook";
import { ISettingRegistry } from "@jupyterlab/settingregistry";
import { IStatusBar } from "@jupyterlab/statusbar";
import { Widget } from "@lumino/widgets";

import { watchAgentCells } from "./agentcells.js";
import { apiBase, apiFetch, pageOption } from "./api.js";
import { AskCellForm } from "./askcell.js";
import { RunWatch } from "./attention.js";
import { cellMarksPlugin } from "./cellmarks.js";
import { runsIcon } from "./icons.js";
import { Attention } from "./notify.js";
import { PageLink, linkUrl, makeChange, workOf } from "./pages.js";
import { RunsPanel, contentsPath } from "./panel.js";
import { restoreOutputs, shownRunIds } from "./restore.js";
import { GO_TO_CELL, OPEN_CONVERSATION, OPEN_RUN, OPEN_TABLE, runPagesPlugin } from "./runpages.js";
import { markShared } from "./shared.js";

/**
 * @typedef {import("@jupyterlab/application").JupyterFrontEnd} JupyterFrontEnd
 * @typedef {import("@jupyterlab/application").JupyterFrontEndPlugin<void>} Plugin
 * @typedef {import("@jupyterlab/notebook").NotebookPanel} NotebookPanel
 * @typedef {import("@jupyterlab/cells").ICodeCellModel} ICodeCellModel
 */

const SHOW_RUNS = "jupyter-agentruns:show-runs";
const ASK_ABOUT_CELL = "agentruns:ask-about-cell";

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
  // A shared document (jupyter-collaboration) keeps the outputs itself, past a
  // refresh; and each page holding it would add the same run's output once more.
  if (notebook.collaborative) {
    markShared(panel.node, /** @type {any} */ (notebook.sharedModel).awareness ?? null);
    return;
  }
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

/** @type {Plugin} */
const pagesPlugin = {
  id: "jupyter-agentruns:open-pages",
  description: "Makes an agent's edit of a notebook open in this page on the page's notebook, then saves it.",
  autoStart: true,
  requires: [INotebookTracker],
  /**
   * @param {JupyterFrontEnd} app
   * @param {import("@jupyterlab/notebook").INotebookTracker} tracker
   */
  activate(app, tracker) {
    /** @param {NotebookPanel} panel */
    const usable = (panel) => !panel.isDisposed && panel.context.isReady && panel.content.model !== null;
    /** @param {string} path */
    const panelOf = (path) => tracker.find((panel) => usable(panel) && panel.context.path === path) ?? null;
    /**
     * Whether the page's notebook is the file as last saved, or newer: the file written
     * meanwhile (an edit made on it while this page was loading, before its link was up, or
     * by another page), a notebook without unsaved work is read again, as "Reload from Disk"
     * does; with unsaved work the page is not the place of the edit (the file is, and saving
     * the page asks the person which to keep, as JupyterLab does).
     * @param {NotebookPanel} panel
     * @returns {Promise<boolean>}
     */
    const fresh = async (panel) => {
      const context = panel.context;
      const known = context.contentsModel?.last_modified;
      const file = await app.serviceManager.contents.get(context.path, { content: false });
      if (!known || !file.last_modified || Date.parse(file.last_modified) <= Date.parse(known)) return true;
      const model = panel.content.model;
      if (model === null || workOf(/** @type {any} */ (model.toJSON())) !== loaded.get(panel)) {
        // Its unsaved work may be an edit the page made and is saving now: looked at again
        // once the page has saved (then what the file has more is read in).
        stale.add(panel);
        return false;
      }
      stale.delete(panel);
      await context.revert();
      return !panel.isDisposed;
    };
    /** The notebooks found older than their files while they held unsaved work. @type {WeakSet<NotebookPanel>} */
    const stale = new WeakSet();
    /**
     * Each open notebook's work as last read from its file or saved to it (see workOf):
     * "dirty" is no guide, JupyterLab marks a notebook dirty when its kernel starts.
     * @type {WeakMap<NotebookPanel, string>}
     */
    const loaded = new WeakMap();
    /** @param {NotebookPanel} panel */
    const remember = (panel) => {
      const model = panel.content.model;
      if (model !== null && !panel.isDisposed) loaded.set(panel, workOf(/** @type {any} */ (model.toJSON())));
    };
    const link = new PageLink({
      url: linkUrl(apiBase(), window.location.href),
      notebooks: {
        paths() {
          /** @type {Set<string>} */
          const paths = new Set();
          tracker.forEach((panel) => {
            if (usable(panel)) paths.add(panel.context.path);
          });
          return [...paths];
        },
        async read(path) {
          const panel = panelOf(path);
          if (panel === null || !(await fresh(panel))) return null;
          return /** @type {object | null} */ (panel.content.model?.toJSON() ?? null);
        },
        make(path, change) {
          const model = panelOf(path)?.content.model;
          return model ? makeChange(model.sharedModel, change) : "the notebook is not open in this page";
        },
        async save(path) {
          const panel = panelOf(path);
          if (panel === null) throw new Error("the notebook was closed");
          await panel.context.save();
        },
        async saved(path) {
          const panel = panelOf(path);
          if (panel !== null) await fresh(panel);
        },
      },
    });
    // Told after the tracker has taken the change in (its own handlers run first or last).
    const tell = () => void Promise.resolve().then(() => link.tell());
    tracker.widgetAdded.connect((_, panel) => {
      panel.context.ready.then(() => {
        remember(panel);
        tell();
      }, () => undefined);
      // Saved, or read again from the file (revert): what the file holds now.
      panel.context.saveState.connect((_, state) => {
        if (state !== "completed") return;
        remember(panel);
        if (stale.has(panel)) void fresh(panel).catch(() => undefined);
      });
      panel.context.fileChanged.connect(() => remember(panel));
      panel.context.pathChanged.connect(tell);
      panel.disposed.connect(tell);
    });
    link.start();
  },
};

/** @type {Plugin} */
const agentCellsPlugin = {
  id: "jupyter-agentruns:agent-cells",
  description: "Shows the prompt of a %%agent cell as Markdown, not Python.",
  autoStart: true,
  requires: [INotebookTracker, IEditorLanguageRegistry],
  /**
   * @param {JupyterFrontEnd} app
   * @param {import("@jupyterlab/notebook").INotebookTracker} tracker
   * @param {import("@jupyterlab/codemirror").IEditorLanguageRegistry} languages
   */
  activate(app, tracker, languages) {
    /** @param {string} mimetype */
    const loaded = (mimetype) => languages.getLanguage(mimetype);
    tracker.widgetAdded.connect((_, panel) => {
      panel.context.ready
        .then(() => {
          const model = panel.content.model;
          if (model !== null) return watchAgentCells(panel.content, /** @type {any} */ (model.cells), loaded);
        })
        .catch((error) => console.warn("agentruns: agent cells keep the notebook's language", error));
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
      openRun: (runId, edit = null) =>
        void (app.commands.hasCommand(OPEN_RUN) && app.commands.execute(OPEN_RUN, edit === null ? { run_id: runId } : { run_id: runId, edit })),
      openTable: () => void (app.commands.hasCommand(OPEN_TABLE) && app.commands.execute(OPEN_TABLE)),
      schedules: true,
      // The conversations as chats, where they open (JupyterLab's main area, not Notebook 7).
      openConversation: (conversation) =>
        void (app.commands.hasCommand(OPEN_CONVERSATION) && app.commands.execute(OPEN_CONVERSATION, { session: conversation.session, agent: conversation.agent })),
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

/** @type {Plugin} */
const askCellPlugin = {
  id: "jupyter-agentruns:ask-about-cell",
  description: "Ask an agent about a notebook's cell, its source and outputs going with the question, in the notebook's conversation.",
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette],
  /**
   * @param {JupyterFrontEnd} app
   * @param {import("@jupyterlab/notebook").INotebookTracker} tracker
   * @param {import("@jupyterlab/apputils").ICommandPalette | null} palette
   */
  activate(app, tracker, palette) {
    // The active cell: the one right-clicked (a right click makes it active), or the one a key moved to.
    const asked = () => {
      const panel = tracker.currentWidget;
      const cell = panel?.content.activeCell ?? null;
      if (!panel || cell === null || !panel.context.isReady) return null;
      const language = panel.content.model?.getMetadata("language_info")?.name;
      return {
        cell: /** @type {any} */ (cell.model.toJSON()),
        index: panel.content.widgets.indexOf(cell),
        notebook: panel.context.path,
        language: typeof language === "string" ? language : "",
        kernelId: panel.sessionContext.session?.kernel?.id ?? null,
      };
    };
    /**
     * The answer streams in the notebook's conversation, docked beside it; the runs panel where there is none.
     * @param {string} session
     * @param {string} agent
     * @param {string} runId
     */
    const openConversation = (session, agent, runId) => {
      if (app.commands.hasCommand(OPEN_CONVERSATION)) void app.commands.execute(OPEN_CONVERSATION, { session, agent, area: "right" });
      else if (app.commands.hasCommand(SHOW_RUNS)) void app.commands.execute(SHOW_RUNS, { session, runIds: [runId] });
    };
    app.commands.addCommand(ASK_ABOUT_CELL, {
      label: "Ask an Agent about This Cell",
      caption: "A question to an agent with the cell's source and outputs, in the notebook's conversation",
      isEnabled: () => asked() !== null,
      execute() {
        const about = asked();
        if (about === null) return;
        /** @type {Dialog<unknown> | null} */
        let dialog = null;
        const form = new AskCellForm({ baseUrl: apiBase(), asked: about, openConversation, closed: () => dialog?.reject() });
        dialog = new Dialog({
          title: "Ask an agent about this cell",
          body: new Widget({ node: form.node }),
          // The form's own Ask and Close: it says there why a run did not start, and stays.
          buttons: [],
          focusNodeSelector: "textarea",
        });
        dialog.addClass("agentruns-askcell-dialog");
        void dialog.launch().catch(() => undefined);
        void form.open();
      },
    });
    app.contextMenu.addItem({ command: ASK_ABOUT_CELL, selector: ".jp-Notebook .jp-Cell", rank: 12 });
    if (palette) palette.addItem({ command: ASK_ABOUT_CELL, category: "Agent runs" });
  },
};

export default [restorePlugin, pagesPlugin, panelPlugin, runPagesPlugin, cellMarksPlugin, askCellPlugin, agentCellsPlugin];
