// New run: a run started from the runs panel, not from a cell: agent, prompt, optional notebook.
//
// Plain DOM, as the panel. The agents come from `GET agents` (the server's
// default_agent first chosen); Enter starts the run (Shift+Enter: a new
// line) through RunActions, so a double press or a retry after a network
// error starts one run. The new run opens on its own page.

import { RunActions } from "./actions.js";
import { apiFetch, withSlash } from "./api.js";
import { button, element } from "./dom.js";
import { FileCompletion, ServerFiles, notebookDir, takesFiles } from "./mentions.js";
import { AgentDirectory, ChoicePickers, offeredBy } from "./pickers.js";

/**
 * @typedef {import("./api.js").Fetch} Fetch
 * @typedef {{name: string, description?: string}} Agent
 * @typedef {{baseUrl: string, openRun?: (runId: string) => void, closed?: () => void, fetch?: Fetch, actions?: RunActions, agents?: AgentDirectory}} NewRunOptions
 * `closed`: told when the form closes (Close, Escape, or started), as a dialog holding it is.
 */

let forms = 0;

/**
 * A notebook path as the server's root names it, or null when it is none (empty, absolute, "..").
 * @param {string} text
 * @returns {string | null | undefined} undefined: nothing given
 */
export function notebookPath(text) {
  const path = text.trim().replace(/^\.\/+/, "");
  if (!path) return undefined;
  const parts = path.split("/");
  if (path.startsWith("/") || parts.some((part) => part === "" || part === "." || part === "..")) return null;
  return path;
}

/**
 * The body of `POST runs` for what the form holds, or why it cannot be one.
 * @param {{agent: string, prompt: string, notebook: string, chosen?: {mode?: string, model?: string}, files?: string[]}} fields
 * `files`: the files the prompt names, for an agent that takes them
 * @returns {{body: {agent: string, input: {prompt: string, mode?: string, model?: string, files?: string[]}, session?: string, metadata?: Record<string, string>}, problem: null} | {body: null, problem: string}}
 */
export function newRunBody({ agent, prompt, notebook, chosen = {}, files = [] }) {
  if (!agent) return { body: null, problem: "Choose an agent." };
  if (!prompt.trim()) return { body: null, problem: "Write what the agent should do." };
  const path = notebookPath(notebook);
  if (path === null) return { body: null, problem: `"${notebook.trim()}" is not a notebook's path under the server's root (like work/analysis.ipynb).` };
  const input = { prompt, ...chosen, ...(files.length > 0 ? { files } : {}) };
  if (path === undefined) return { body: { agent, input }, problem: null };
  // The notebook's conversation, as a cell of it would start one.
  return { body: { agent, input, session: path, metadata: { notebook: path } }, problem: null };
}

/** The New run form of the runs panel. */
export class NewRunForm {
  /** @param {NewRunOptions} options */
  constructor(options) {
    this.baseUrl = withSlash(options.baseUrl);
    this.openRun = options.openRun || null;
    this.closed = options.closed || null;
    this.fetch = options.fetch || apiFetch;
    this.actions = options.actions || new RunActions({ baseUrl: this.baseUrl, fetch: this.fetch });
    this.id = `newrun-${++forms}`;
    // Not the page's shared one: a form opened again shows what the agents offer now.
    this.directory = options.agents || new AgentDirectory({ baseUrl: this.baseUrl, fetch: this.fetch });
    /** @type {Agent[] | null} */
    this.agents = null;
    /** @type {any[]} */
    this.described = [];
    this.busy = false;

    this.node = /** @type {HTMLFormElement} */ (element("form", "agentruns-newrun"));
    this.node.hidden = true;
    this.node.setAttribute("aria-label", "New run");
    this.agent = /** @type {HTMLSelectElement} */ (element("select", "agentruns-newrun-agent"));
    this.prompt = /** @type {HTMLTextAreaElement} */ (element("textarea", "agentruns-newrun-prompt"));
    this.prompt.rows = 3;
    this.prompt.placeholder = "What should the agent do? (Enter starts it, Shift+Enter a new line)";
    this.notebook = /** @type {HTMLInputElement} */ (element("input", "agentruns-newrun-notebook"));
    this.notebook.placeholder = "notebook (optional), e.g. work/analysis.ipynb";
    this.pickers = new ChoicePickers("agentruns-newrun-pickers");
    // `@` in the prompt offers the server's files, the notebook's directory first.
    this.completion = new FileCompletion(this.prompt, {
      files: new ServerFiles({ baseUrl: () => this.baseUrl, fetch: this.fetch }),
      home: () => notebookDir(notebookPath(this.notebook.value) || ""),
    });
    this.startButton = button("Start", "agentruns-newrun-start");
    this.startButton.type = "submit";
    this.closeButton = button("Close", "agentruns-newrun-close");
    this.closeButton.type = "button";
    this.message = element("div", "agentruns-newrun-message");
    this.message.setAttribute("role", "status");
    const labelled = (/** @type {string} */ text, /** @type {HTMLElement} */ field) => {
      const label = element("label", "agentruns-newrun-field");
      label.append(element("span", "agentruns-newrun-label", text), field);
      return label;
    };
    const buttons = element("div", "agentruns-newrun-buttons");
    buttons.append(this.startButton, this.closeButton);
    this.node.append(labelled("Agent", this.agent), this.pickers.node, labelled("Prompt", this.prompt), this.completion.node, labelled("Notebook", this.notebook), buttons, this.message);
    this.agent.addEventListener("change", () => this._offer());

    this.node.addEventListener("submit", (event) => {
      event.preventDefault();
      void this.start();
    });
    this.prompt.addEventListener("keydown", (event) => {
      // Its keys are the form's, not JupyterLab's shortcuts.
      event.stopPropagation();
      // While the file list is open, its keys choose a file (Escape closes the list, not the form).
      if (this.completion.keydown(event)) return;
      if (event.key === "Escape") this.close();
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        void this.start();
      }
    });
    this.node.addEventListener("keydown", (event) => {
      if (event.key === "Escape") this.close();
    });
    this.closeButton.addEventListener("click", () => this.close());
  }

  /** Show the form (the agents read once), its prompt focused. */
  async open() {
    this.node.hidden = false;
    this.prompt.focus();
    if (this.agents === null) await this._loadAgents();
  }

  close() {
    this.node.hidden = true;
    if (this.closed) this.closed();
  }

  toggle() {
    if (this.node.hidden) void this.open();
    else this.close();
  }

  async _loadAgents() {
    let answer;
    try {
      answer = await this.directory.answer();
    } catch (error) {
      const why = error instanceof TypeError ? "cannot reach the server." : /** @type {Error} */ (error).message;
      return this._say(`Cannot list the agents: ${why}`);
    }
    this.described = Array.isArray(answer?.agents) ? answer.agents : [];
    this.agents = Array.isArray(answer?.agents) ? answer.agents.filter((/** @type {any} */ agent) => typeof agent?.name === "string") : [];
    const agents = /** @type {Agent[]} */ (this.agents);
    this.agent.replaceChildren(
      ...agents.map((agent) => {
        const option = /** @type {HTMLOptionElement} */ (element("option", "", agent.name));
        option.value = agent.name;
        if (agent.description) option.title = agent.description;
        return option;
      })
    );
    const preferred = typeof answer?.default_agent === "string" ? answer.default_agent : "";
    if (agents.some((agent) => agent.name === preferred)) this.agent.value = preferred;
    if (agents.length === 0) this._say("This server has no agents.");
    this._offer();
  }

  /** The pickers show the modes and models of the agent chosen. */
  _offer() {
    const agent = this.described.find((described) => described?.name === this.agent.value);
    this.pickers.show(offeredBy(agent), []);
  }

  /** Start the run the form describes, then open it; the form says why not. */
  async start() {
    if (this.busy) return;
    this.busy = true;
    const described = this.described.find((agent) => agent?.name === this.agent.value);
    const files = takesFiles(described) ? await this.completion.filesOf(this.prompt.value) : [];
    const { body, problem } = this.body(files);
    if (body === null) {
      this.busy = false;
      return this._say(problem);
    }
    this.startButton.disabled = true;
    this._say("Starting…");
    const outcome = await this.actions.start(this.id, body);
    this.busy = false;
    this.startButton.disabled = false;
    if (outcome.run === null) return this._say(`Not started: ${outcome.problem}`);
    this._say("");
    this.prompt.value = "";
    // The next Start is a new run: its key differs (the action was answered).
    this.close();
    this.started(outcome.run);
  }

  /**
   * The body of `POST runs` for what the form holds, or why it cannot be one.
   * @param {string[]} [files] the files the prompt names, for an agent that takes them
   * @returns {ReturnType<typeof newRunBody>}
   */
  body(files = []) {
    return newRunBody({
      agent: this.agent.value, prompt: this.prompt.value, notebook: this.notebook.value, chosen: this.pickers.chosen(), files,
    });
  }

  /**
   * What follows a start: the run's page.
   * @param {import("./runstate.js").Run} run
   */
  started(run) {
    if (this.openRun) this.openRun(run.run_id);
  }

  /** @param {string} text */
  _say(text) {
    this.message.textContent = text;
    this.message.hidden = !text;
  }
}
