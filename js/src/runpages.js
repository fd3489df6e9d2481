// JupyterLab's side of a run's own page and of the runs table: the commands
// that open them in the main area, and the way to a run's cell.

import { ILabShell, ILayoutRestorer, IRouter } from "@jupyterlab/application";
import { WidgetTracker } from "@jupyterlab/apputils";
import { Widget } from "@lumino/widgets";

import { apiBase, pageOption } from "./api.js";
import { COMPARE_EVENT, ComparePage } from "./compare.js";
import { CONVERSATION_REFRESH_MS, ConversationView, conversationKey, sessionName } from "./conversations.js";
import { runsIcon } from "./icons.js";
import { RunsPanel } from "./panel.js";
import { OPEN_RUN_EVENT, RUN_PAGE_PARAM, runInAddress } from "./links.js";
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
export const OPEN_CONVERSATION = "agentruns:open-conversation";
export const OPEN_RUN_LINK = "agentruns:open-run-link";
export const OPEN_COMPARE = "agentruns:compare-runs";

/** A conversation's view as a tab: in the main area, or docked in the right sidebar. */
class ConversationWidget extends Widget {
  /**
   * @param {ConversationView} view
   * @param {string} area "main" or "right"
   */
  constructor(view, area) {
    super({ node: view.node });
    this.view = view;
    this.area = area;
    this.key = conversationKey(view.session, view.agent);
    this.id = `jupyter-agentruns-conversation-${Array.from(this.key, (c) => c.charCodeAt(0).toString(16)).join("")}`;
    this.addClass("agentruns-conversation-widget");
    this.title.label = `${view.agent} · ${sessionName(view.session)}`;
    this.title.icon = runsIcon;
    this.title.caption = `Conversation with ${view.agent} in ${view.session}`;
    this.title.closable = true;
    /** @type {any} */
    this.timer = null;
  }

  // Runs started elsewhere show while it is on screen; nothing is asked while it is hidden.
  onAfterShow() {
    this._follow();
  }

  onAfterAttach() {
    if (this.isVisible) this._follow();
  }

  onBeforeHide() {
    this._stop();
  }

  onBeforeDetach() {
    this._stop();
  }

  _follow() {
    if (this.timer === null) this.timer = setInterval(() => void this.view.refresh(), CONVERSATION_REFRESH_MS);
  }

  _stop() {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  /** @param {import("@lumino/messaging").Message} msg */
  onCloseRequest(msg) {
    super.onCloseRequest(msg);
    this.dispose();
  }

  dispose() {
    this._stop();
    this.view.dispose();
    super.dispose();
  }
}

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

/** Two runs side by side, as a main-area tab. */
class CompareWidget extends Widget {
  /** @param {ComparePage} page */
  constructor(page) {
    super({ node: page.node });
    this.page = page;
    this.id = `jupyter-agentruns-compare-${page.ids.join("-")}`;
    this.addClass("agentruns-compare-widget");
    this.title.label = "Compare runs";
    this.title.icon = runsIcon;
    this.title.caption = `${page.ids[0]} and ${page.ids[1]}, side by side`;
    this.title.closable = true;
  }

  /** @param {import("@lumino/messaging").Message} msg */
  onCloseRequest(msg) {
    super.onCloseRequest(msg);
    this.dispose();
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
  optional: [ILabShell, ILayoutRestorer, IRouter],
  /**
   * @param {JupyterFrontEnd} app
   * @param {import("@jupyterlab/application").ILabShell | null} labShell
   * @param {import("@jupyterlab/application").ILayoutRestorer | null} restorer
   * @param {import("@jupyterlab/application").IRouter | null} router
   */
  activate(app, labShell, restorer, router) {
    if (labShell === null) return;
    /** @type {Map<string, RunPageWidget>} */
    const pages = new Map();
    // A refresh opens the run pages that were open again, where they were.
    /** @type {WidgetTracker<RunPageWidget>} */
    const trackedPages = new WidgetTracker({ namespace: "agentruns-run-pages" });
    if (restorer) {
      void restorer.restore(trackedPages, {
        command: OPEN_RUN,
        args: (widget) => ({ run_id: widget.page.runId }),
        name: (widget) => widget.page.runId,
      });
    }
    /** @type {RunsTableWidget | null} */
    let table = null;
    const serverRoot = pageOption("agentrunsServerRoot") || pageOption("serverRoot");

    /**
     * @param {string} runId
     * @param {string | null} [edit] at its notebook edits: this one's card ("" for the section)
     */
    const openRun = (runId, edit = null) => void app.commands.execute(OPEN_RUN, edit === null ? { run_id: runId } : { run_id: runId, edit });

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
      caption: "Open a run's own page: its timeline, answer, notebook edits, attempts and cell",
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
          void trackedPages.add(made);
        }
        app.shell.activateById(widget.id);
        // At its notebook edits: an edit's card (a cell's mark asks so), or the section (the panel's count).
        if (typeof args.edit === "string") widget.page.showEdit(args.edit);
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

    /** @type {Map<string, CompareWidget>} */
    const comparisons = new Map();
    app.commands.addCommand(OPEN_COMPARE, {
      label: "Compare Agent Runs",
      caption: "Two runs side by side: answers diffed, steps aligned, tokens, cost and time",
      execute(args) {
        const left = typeof args.left === "string" ? args.left : "";
        const right = typeof args.right === "string" ? args.right : "";
        if (!left || !right) return;
        const key = `${left} ${right}`;
        let widget = comparisons.get(key);
        if (widget === undefined || widget.isDisposed) {
          const page = new ComparePage({ baseUrl: apiBase(), left, right, openRun });
          const made = new CompareWidget(page);
          widget = made;
          comparisons.set(key, made);
          made.disposed.connect(() => comparisons.delete(key));
          void page.load();
          app.shell.add(made, "main");
        }
        app.shell.activateById(widget.id);
        return widget;
      },
    });
    document.addEventListener(COMPARE_EVENT, (event) => {
      const detail = /** @type {CustomEvent} */ (event).detail;
      void app.commands.execute(OPEN_COMPARE, { left: detail?.left, right: detail?.right });
    });

    /** @type {Map<string, ConversationWidget>} */
    const conversations = new Map();
    // A refresh opens the conversations that were open again, where they were.
    /** @type {WidgetTracker<ConversationWidget>} */
    const tracked = new WidgetTracker({ namespace: "agentruns-conversations" });
    if (restorer) {
      void restorer.restore(tracked, {
        command: OPEN_CONVERSATION,
        args: (widget) => ({ session: widget.view.session, agent: widget.view.agent, area: widget.area }),
        name: (widget) => widget.key,
      });
    }

    app.commands.addCommand(OPEN_CONVERSATION, {
      label: "Open Agent Conversation",
      caption: "A notebook's runs of one agent as a chat, with a box to reply",
      execute(args) {
        const session = typeof args.session === "string" ? args.session : "";
        const agent = typeof args.agent === "string" ? args.agent : "";
        if (!session || !agent) return;
        const area = args.area === "right" ? "right" : "main";
        const key = conversationKey(session, agent);
        let widget = conversations.get(key);
        if (widget !== undefined && !widget.isDisposed && widget.area !== area) {
          // Moved: the open one closes, a new one opens where asked.
          widget.dispose();
          widget = undefined;
        }
        if (widget === undefined || widget.isDisposed) {
          const view = new ConversationView({
            baseUrl: apiBase(),
            session,
            agent,
            openBeside: area === "main" ? () => void app.commands.execute(OPEN_CONVERSATION, { session, agent, area: "right" }) : undefined,
          });
          const made = new ConversationWidget(view, area);
          widget = made;
          conversations.set(key, made);
          made.disposed.connect(() => {
            if (conversations.get(key) === made) conversations.delete(key);
          });
          void view.load();
          app.shell.add(made, area, area === "right" ? { rank: 900 } : undefined);
          void tracked.add(made);
        }
        app.shell.activateById(widget.id);
        return widget;
      },
    });

    // A link to a run's page (`lab?agentruns-run=<id>`, what an MCP client's
    // start_run answers as page_url) opens it once the layout is restored; the
    // parameter leaves the address, so that a reload opens no page again.
    if (router !== null) {
      app.commands.addCommand(OPEN_RUN_LINK, {
        label: "Open the Agent Run of a Link",
        async execute(args) {
          const { runId, rest } = runInAddress(typeof args.search === "string" ? args.search : "");
          if (runId === null) return;
          const { pathname, hash } = window.location;
          window.history.replaceState(window.history.state, "", `${pathname}${rest}${hash}`);
          await app.restored;
          openRun(runId);
        },
      });
      router.register({ command: OPEN_RUN_LINK, pattern: new RegExp(`[?&]${RUN_PAGE_PARAM}=[^&#]`) });
    }

    // A run view (in a notebook, or on a run's page) asks for a run's page
    // with a DOM event: it knows nothing of JupyterLab.
    document.body.dataset.agentrunsRunPages = "true";
    document.addEventListener(OPEN_RUN_EVENT, (event) => {
      const detail = /** @type {CustomEvent} */ (event).detail;
      const runId = detail?.runId;
      if (typeof runId === "string" && runId) openRun(runId, typeof detail.edit === "string" ? detail.edit : null);
    });
  },
};
