// A conversation under a run's view: the follow-ups sent from its box, each
// a new run in the same conversation (same agent and session), shown below it
// in order as a thread, and the box to send the next.
//
// A follow-up names the run it follows up in `metadata.follow_up_of` (the
// thread's first run), so any page finds the thread again from the server:
// the session's runs newer than the first, read once per page and shared by
// the views of that session. Sending goes through RunActions: Enter pressed
// twice, or again after a network error, sends one run.

import { RunActions } from "./actions.js";
import { apiFetch, errorMessage, runsUrl } from "./api.js";
import { button, element } from "./dom.js";
import { pageHost } from "./hosts.js";
import { FileCompletion, ServerFiles, notebookDir, takesFiles } from "./mentions.js";
import { ChoicePickers, pageAgents } from "./pickers.js";
import { isTerminal } from "./status.js";

/**
 * @typedef {import("./runstate.js").Run} Run
 * @typedef {import("./api.js").Fetch} Fetch
 * @typedef {import("./pickers.js").AgentDirectory} AgentDirectory
 * @typedef {{mode?: string, model?: string, files?: string[]}} Chosen what goes into the input beside the prompt
 * @typedef {{files: ServerFiles, home: () => string, attaches: () => Promise<boolean>}} Mentions
 * `home`: the directory of the notebook the conversation works in ("" when none); `attaches`: whether the agent takes `files`.
 */

/** The metadata key of a follow-up: the id of its thread's first run. */
export const FOLLOW_UP_OF = "follow_up_of";
/** Runs read per request when a thread is looked for. */
export const THREAD_PAGE = 100;
/** What the metadata of a follow-up keeps of its thread's first run: where it works, not which cell. */
const CARRIED = ["notebook", "kernel_id"];

/**
 * The first run of the thread `run` belongs to.
 * @param {Run} run
 * @returns {string}
 */
export function threadRoot(run) {
  const root = run.metadata && run.metadata[FOLLOW_UP_OF];
  return typeof root === "string" && root ? root : run.run_id;
}

/**
 * The body of `POST runs` for a follow-up of `root` saying `text`, with the mode and model chosen.
 * @param {Run} root the thread's first run
 * @param {string} text
 * @param {Chosen} [chosen]
 * @returns {{agent: string, session: string, input: {prompt: string} & Chosen, metadata: Record<string, any>}}
 */
export function followUpBody(root, text, chosen = {}) {
  /** @type {Record<string, any>} */
  const metadata = { [FOLLOW_UP_OF]: root.run_id };
  for (const name of CARRIED) if (root.metadata && typeof root.metadata[name] === "string") metadata[name] = root.metadata[name];
  return { agent: root.agent, session: /** @type {string} */ (root.session), input: { prompt: text, ...chosen }, metadata };
}

/**
 * The directory of the notebook a run works in: its `metadata.notebook`, else its session when that is a notebook's path.
 * @param {{session?: any, metadata?: any}} run
 * @returns {string}
 */
export function runHome(run) {
  const notebook = run.metadata && typeof run.metadata.notebook === "string" ? run.metadata.notebook : null;
  const session = typeof run.session === "string" && run.session.endsWith(".ipynb") ? run.session : null;
  return notebookDir(notebook || session);
}

/**
 * How a box finds the server's files and whether `agent` takes them.
 * @param {() => string} baseUrl
 * @param {() => AgentDirectory} agents
 * @param {() => string} agent
 * @param {() => string} home
 * @param {Fetch} [fetch]
 * @returns {Mentions}
 */
export function agentMentions(baseUrl, agents, agent, home, fetch) {
  return {
    files: new ServerFiles({ baseUrl, fetch }),
    home,
    attaches: async () => takesFiles(await agents().agent(agent())),
  };
}

/**
 * Whether the box can send now, and if not, why (a sentence for the person).
 * @param {Run | null} root
 * @param {Array<{status: string}>} runs the thread's runs (its first included) as last seen
 * @returns {string} "" when it can
 */
export function whyNot(root, runs) {
  if (root === null) return "Loading the run…";
  if (typeof root.session !== "string" || !root.session) {
    return "This run has no conversation to continue: it was started without a session.";
  }
  if (runs.some((run) => run.status && !isTerminal(run.status))) {
    return "The agent is still on the last message: wait for it, or cancel it.";
  }
  return "";
}

/**
 * The runs of each session newer than some time, read once per page and shared.
 * @typedef {{runs: Run[], next: string | null, oldest: string | null, reading: Promise<void> | null}} SessionRuns
 */
export class ThreadIndex {
  /** @param {{baseUrl: string, fetch?: Fetch}} options */
  constructor(options) {
    this.baseUrl = options.baseUrl;
    this.fetch = options.fetch || apiFetch;
    /** @type {Map<string, SessionRuns>} */
    this.sessions = new Map();
  }

  /**
   * The follow-ups of `root`, oldest first.
   * @param {Run} root
   * @returns {Promise<Run[]>}
   */
  async followUps(root) {
    const session = root.session;
    if (typeof session !== "string" || !session) return [];
    const since = root.created_at || "";
    let known = this.sessions.get(session);
    if (known === undefined) {
      known = { runs: [], next: "", oldest: null, reading: null };
      this.sessions.set(session, known);
    }
    const entry = known;
    // Read on (newest first) until a run older than the root shows, or there is none.
    while (entry.next !== null && (entry.oldest === null || entry.oldest > since)) {
      if (entry.reading === null) entry.reading = this._page(session, entry).finally(() => (entry.reading = null));
      await entry.reading;
    }
    return entry.runs
      .filter((run) => run.metadata && run.metadata[FOLLOW_UP_OF] === root.run_id)
      .sort((a, b) => String(a.created_at || "").localeCompare(String(b.created_at || "")));
  }

  /**
   * A follow-up sent from this page: its thread shows it without asking the server again.
   * @param {Run} run
   */
  add(run) {
    const entry = typeof run.session === "string" ? this.sessions.get(run.session) : undefined;
    if (entry !== undefined && !entry.runs.some((known) => known.run_id === run.run_id)) entry.runs.unshift(run);
  }

  /**
   * @param {string} session
   * @param {SessionRuns} entry
   */
  async _page(session, entry) {
    const query = new URLSearchParams({ session, limit: String(THREAD_PAGE) });
    if (entry.next) query.set("before", entry.next);
    const response = await this.fetch(`${runsUrl(this.baseUrl)}?${query}`);
    if (!response.ok) throw new Error(await errorMessage(response));
    const page = await response.json();
    const runs = Array.isArray(page?.runs) ? page.runs : [];
    for (const run of runs) if (!entry.runs.some((known) => known.run_id === run.run_id)) entry.runs.push(run);
    if (runs.length > 0) entry.oldest = runs[runs.length - 1].created_at;
    entry.next = typeof page?.next === "string" && page.next ? page.next : null;
  }
}

const INDEXES_KEY = "__jupyterAgentrunsThreads";

/**
 * The page's thread index for the server at `baseUrl` (shared by every copy of this module).
 * @param {string} baseUrl
 * @returns {ThreadIndex}
 */
export function pageThreads(baseUrl) {
  const page = /** @type {Record<string, any>} */ (globalThis);
  if (!(page[INDEXES_KEY] instanceof Map)) page[INDEXES_KEY] = new Map();
  const indexes = /** @type {Map<string, ThreadIndex>} */ (page[INDEXES_KEY]);
  let index = indexes.get(baseUrl);
  if (index === undefined) {
    index = new ThreadIndex({ baseUrl });
    indexes.set(baseUrl, index);
  }
  return index;
}

/**
 * The box under a thread: Enter sends, Shift+Enter is a new line; disabled, saying why, while it
 * cannot send. Beside it, the agent's modes and models where it offers some.
 */
export class FollowUpBox {
  /**
   * @param {(text: string, chosen: Chosen) => Promise<string | null>} send answers why it was not sent, or null
   * @param {Mentions | null} [mentions] where `@` offers the server's files (none without)
   */
  constructor(send, mentions = null) {
    this.send = send;
    this.sending = false;
    this.reason = "";
    this.node = element("div", "agentruns-followup");
    this.text = /** @type {HTMLTextAreaElement} */ (element("textarea", "agentruns-followup-text"));
    this.text.rows = 1;
    this.text.placeholder = "Reply to the agent (Enter sends, Shift+Enter a new line)";
    this.text.setAttribute("aria-label", "Reply to the agent");
    this.sendButton = button("Send", "agentruns-followup-send");
    this.note = element("div", "agentruns-followup-note");
    this.note.setAttribute("role", "status");
    const line = element("div", "agentruns-followup-line");
    this.pickers = new ChoicePickers("agentruns-followup-pickers");
    line.append(this.text, this.pickers.node, this.sendButton);
    this.mentions = mentions;
    this.completion = mentions === null ? null : new FileCompletion(this.text, mentions);
    this.node.append(line, ...(this.completion === null ? [] : [this.completion.node]), this.note);
    this.text.addEventListener("keydown", (event) => {
      // The box's keys are the box's: not the notebook's shortcuts (Shift+Enter runs a cell there).
      event.stopPropagation();
      // While the file list is open, its keys choose a file: Enter takes one, it does not send.
      if (this.completion !== null && this.completion.keydown(event)) return;
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        void this.submit();
      }
    });
    this.sendButton.addEventListener("click", () => void this.submit());
    this.text.addEventListener("input", () => this._draw());
    this._draw();
  }

  /** Its text was set: the Send button follows. */
  changed() {
    this._draw();
  }

  /**
   * Why it cannot send now ("" when it can).
   * @param {string} reason
   */
  setReason(reason) {
    if (reason === this.reason) return;
    this.reason = reason;
    this._draw();
  }

  /** Send what the box holds, once. */
  async submit() {
    const text = this.text.value.trim();
    if (this.sending || this.reason || !text) return;
    this.sending = true;
    this._draw();
    /** @type {Chosen} */
    const chosen = this.pickers.chosen();
    const files = await this._files(text);
    if (files.length > 0) chosen.files = files;
    const problem = await this.send(text, chosen);
    this.sending = false;
    if (problem === null) this.text.value = "";
    this.note.textContent = problem === null ? "" : `Not sent: ${problem}`;
    this._draw();
  }

  /**
   * The files the text names, where the agent takes files.
   * @param {string} text
   * @returns {Promise<string[]>}
   */
  async _files(text) {
    if (this.mentions === null || this.completion === null || !text.includes("@")) return [];
    try {
      return (await this.mentions.attaches()) ? await this.completion.filesOf(text) : [];
    } catch {
      return []; // the agents unread: the text keeps its mentions, nothing is attached
    }
  }

  _draw() {
    const blocked = Boolean(this.reason) || this.sending;
    this.text.disabled = blocked;
    this.pickers.setDisabled(blocked);
    this.sendButton.disabled = blocked || !this.text.value.trim();
    this.node.dataset.state = this.sending ? "sending" : this.reason ? "blocked" : "ready";
    if (this.reason) this.note.textContent = this.reason;
    else if (this.note.textContent && !this.note.textContent.startsWith("Not sent")) this.note.textContent = "";
    this.text.title = this.reason;
  }
}

/**
 * What of `chosen` tells one intended message from another.
 * @param {Chosen} chosen
 * @returns {string}
 */
export function chosenKey(chosen) {
  return `${chosen.mode ?? ""} ${chosen.model ?? ""} ${(chosen.files ?? []).join("\u0000")}`;
}

/**
 * Send a follow-up of `root` through `actions`: one run per intended message.
 * @param {RunActions} actions
 * @param {Run} root
 * @param {string} text
 * @param {number} count the thread's length when it was sent (another message is another action)
 * @param {Chosen} [chosen] the mode and model picked
 */
export function sendFollowUp(actions, root, text, count, chosen = {}) {
  // The text and the choices are part of the action: a changed one after a network error is another.
  const picked = chosenKey(chosen);
  return actions.start(`follow-up ${root.run_id} ${count} ${picked} ${text}`, followUpBody(root, text, chosen));
}

/** How long a draft waits for the view drawn again in its place. */
export const DRAFT_SECONDS = 10;
const DRAFTS_KEY = "__jupyterAgentrunsDrafts";

/**
 * @typedef {{text: string, focused: boolean, start: number, end: number, at: number}} Draft
 * @returns {Map<string, Draft>} the page's drafts by thread, on globalThis: every copy of this module sees them
 */
function drafts() {
  const page = /** @type {Record<string, any>} */ (globalThis);
  if (!(page[DRAFTS_KEY] instanceof Map)) page[DRAFTS_KEY] = new Map();
  return page[DRAFTS_KEY];
}

/**
 * A view going away keeps what its box held: an output drawn again (another page's change of
 * a shared notebook, the kernel's update of its display) makes a new view of the same run,
 * and the person's reply being typed, and where they were in it, go on there.
 * @param {string} runId the thread's first run
 * @param {HTMLTextAreaElement} text
 */
function keepDraft(runId, text) {
  const focused = text.ownerDocument.activeElement === text;
  if (!text.value && !focused) return;
  const start = text.selectionStart ?? text.value.length;
  const end = text.selectionEnd ?? start;
  drafts().set(runId, { text: text.value, focused, start, end, at: Date.now() });
}

/**
 * The new view of a thread takes the draft its last view kept, if that was just now; it takes
 * the focus too where the old box had it and nothing else has taken it since.
 * @param {string} runId
 * @param {FollowUpBox} box
 */
function takeDraft(runId, box) {
  const draft = drafts().get(runId);
  if (draft === undefined) return;
  drafts().delete(runId);
  if (Date.now() - draft.at > DRAFT_SECONDS * 1000 || box.text.value) return;
  box.text.value = draft.text;
  box.changed();
  const active = box.text.ownerDocument.activeElement;
  if (draft.focused && !box.text.disabled && (active === null || active === box.text.ownerDocument.body)) {
    box.text.focus();
    box.text.setSelectionRange(draft.start, draft.end);
  }
}

/**
 * What the thread needs of the view it is under.
 * @typedef {{
 *   baseUrl(): string,
 *   actions(): RunActions,
 *   makeView(host: any, el: HTMLElement): {attach(runId: string): void, dispose(): void},
 *   index?: ThreadIndex,
 *   ended?(runIds: string[]): void,
 *   agents?: AgentDirectory,
 * }} ThreadHost
 * `ended`: the follow-ups of the thread that have ended, in order, each time the thread is drawn
 * (where the record of the thread is kept, it is brought up to date when this list changes).
 */

/** The follow-ups under a run's view, each shown as a view of its own, and the box to send the next. */
export class ThreadSection {
  /** @param {ThreadHost} host */
  constructor(host) {
    this.host = host;
    this.node = element("div", "agentruns-thread");
    this.list = element("div", "agentruns-thread-runs");
    /** @type {Run | null} */
    this.root = null;
    this.rootStatus = "";
    /** @type {{runId: string, status: string, view: {attach(runId: string): void, dispose(): void}, node: HTMLElement}[]} */
    this.entries = [];
    this.generation = 0;
    /** The inputs of the thread's runs, oldest first: the pickers hold what the last one chose. */
    /** @type {any[]} */
    this.inputs = [];
    this.offeredAny = false;
    this.busy = false;
    this.askedAgain = false;
    const root = () => this.root;
    this.box = new FollowUpBox(
      (text, chosen) => this._send(text, chosen),
      agentMentions(() => this.host.baseUrl(), () => this.agents, () => root()?.agent ?? "", () => {
        const shown = root();
        return shown === null ? "" : runHome(shown);
      }),
    );
    this.node.append(this.list, this.box.node);
    this.box.setReason(whyNot(null, []));
  }

  get index() {
    return this.host.index || pageThreads(this.host.baseUrl());
  }

  get agents() {
    return this.host.agents || pageAgents(this.host.baseUrl());
  }

  /**
   * The view shows `root` (a thread's first run, or a follow-up: its thread is its first run's).
   * @param {Run} root
   * @param {string} status
   */
  show(root, status) {
    this.rootStatus = status;
    if (this.root === null || this.root.run_id !== root.run_id) {
      this._clear();
      this.root = root;
      this.inputs = [root.input];
      this.offeredAny = this.askedAgain = this.busy = false;
      if (threadRoot(root) === root.run_id) {
        void this._load(this.generation);
        void this._offer(this.generation, false);
      }
      this._reason();
      takeDraft(root.run_id, this.box);
      return;
    }
    this._reason();
  }

  dispose() {
    this.generation += 1;
    if (this.root !== null) keepDraft(this.root.run_id, this.box.text);
    this._clear();
  }

  _clear() {
    this.generation += 1;
    for (const entry of this.entries) entry.view.dispose();
    this.entries = [];
    this.list.replaceChildren();
    this.root = null;
  }

  /** @param {number} generation */
  async _load(generation) {
    const root = /** @type {Run} */ (this.root);
    let runs;
    try {
      runs = await this.index.followUps(root);
    } catch {
      return; // the thread shows what this page sends; the first run's view is whole without it
    }
    if (generation !== this.generation) return;
    for (const run of runs) this._append(run.run_id, run.status);
    this.inputs.push(...runs.map((run) => run.input));
    this._reason();
    void this._offer(generation, false);
  }

  /**
   * The pickers show what the thread's agent offers; `again`: ask the server anew (an agent
   * says its modes and models once it has opened a session: after the thread's first run).
   * @param {number} generation
   * @param {boolean} again
   */
  async _offer(generation, again) {
    const root = this.root;
    if (root === null) return;
    if (again) this.agents.forget();
    let offered;
    try {
      offered = await this.agents.offered(root.agent);
    } catch {
      return; // no pickers: the agent's own mode and model
    }
    if (generation !== this.generation) return;
    this.offeredAny = offered.mode.length > 0 || offered.model.length > 0;
    this.box.pickers.show(offered, this.inputs);
  }

  /**
   * @param {string} runId
   * @param {string} status
   */
  _append(runId, status) {
    if (this.entries.some((entry) => entry.runId === runId)) return;
    const node = element("div", "agentruns-thread-run");
    const entry = { runId, status, node, view: /** @type {any} */ (null) };
    const base = this.host.baseUrl();
    entry.view = this.host.makeView(
      pageHost(() => entry.runId, () => base, {
        ranAgain: (run) => {
          entry.runId = run.run_id;
          entry.view.attach(run.run_id);
        },
        shown: (/** @type {{status: string}} */ state) => {
          entry.status = state.status;
          this._reason();
        },
      }),
      node,
    );
    this.entries.push(entry);
    this.list.append(node);
    entry.view.attach(runId);
  }

  _reason() {
    const runs = [{ status: this.rootStatus }, ...this.entries.map((entry) => ({ status: entry.status }))];
    // A follow-up's own view has no box: its thread's first run has it.
    const root = this.root;
    this.box.node.hidden = root !== null && threadRoot(root) !== root.run_id;
    // A run that just ended may have been its agent's first session: what it offers is known now.
    const busy = runs.some((run) => run.status && !isTerminal(run.status));
    if (this.busy && !busy && !this.offeredAny && !this.askedAgain) {
      this.askedAgain = true; // once per thread: an agent with nothing to offer is not asked after each run
      void this._offer(this.generation, true);
    }
    this.busy = busy;
    this.box.setReason(whyNot(root, runs));
    if (this.host.ended) this.host.ended(this.entries.filter((entry) => isTerminal(entry.status)).map((entry) => entry.runId));
  }

  /**
   * @param {string} text
   * @param {Chosen} chosen
   * @returns {Promise<string | null>}
   */
  async _send(text, chosen) {
    const root = this.root;
    if (root === null) return "the run is not loaded yet";
    const outcome = await sendFollowUp(this.host.actions(), root, text, this.entries.length, chosen);
    if (outcome.run === null) return outcome.problem;
    this.index.add(outcome.run);
    if (this.root === root) this.inputs.push(outcome.run.input ?? { prompt: text, ...chosen });
    if (this.root === root) this._append(outcome.run.run_id, outcome.run.status);
    this._reason();
    return null;
  }
}
