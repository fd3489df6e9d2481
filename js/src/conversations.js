// Conversations as a chat: the list of the caller's conversations (a session
// and an agent, its runs one after another), and a conversation's view, its
// runs oldest first with one reply box at the bottom.
//
// Plain DOM, no JupyterLab import: the runs panel shows the list, the
// labextension puts a view in the main area or the right sidebar
// (runpages.js), the tests drive both in jsdom. Every message of the chat is
// a durable run: a reply is `POST runs` in the same session and agent,
// naming the conversation's first run in `metadata.follow_up_of`.

import { RunActions } from "./actions.js";
import { apiFetch, errorMessage, runsUrl, withSlash } from "./api.js";
import { button, element, formatAgo, parseTime } from "./dom.js";
import { pageHost } from "./hosts.js";
import { pageAgents } from "./pickers.js";
import { FollowUpBox, agentMentions, chosenKey, followUpBody, runHome, threadRoot, whyNot } from "./thread.js";
import { RunView } from "./view.js";

/**
 * @typedef {import("./runstate.js").Run} Run
 * @typedef {import("./api.js").Fetch} Fetch
 * @typedef {import("./pickers.js").AgentDirectory} AgentDirectory
 * @typedef {{session: string, agent: string, title?: string, runs?: number, last_run_id?: string, updated_at?: string}} Conversation
 * @typedef {{attach(runId: string): void, dispose(): void}} ShownRun
 */

/** Conversations listed per page; "More" adds another. */
export const CONVERSATIONS_PAGE = 20;
/** Runs of the session read per request by a conversation's view; "Earlier" reads the next. */
export const CONVERSATION_PAGE = 20;
/** The most conversations read again at once (the API's own limit). */
export const MAX_CONVERSATIONS = 500;
/** How often an open conversation looks for runs started elsewhere (a notebook's cell, another tab). */
export const CONVERSATION_REFRESH_MS = 5000;
/** What the list says when there is no conversation. */
export const NO_CONVERSATIONS = "No conversations yet: a run with a session (a notebook's %%agent cell, or New run with a notebook) starts one.";

/**
 * The URL of `GET conversations` under `baseUrl`.
 * @param {string} baseUrl
 * @returns {string}
 */
export function conversationsUrl(baseUrl) {
  return `${withSlash(baseUrl)}api/agentruns/conversations`;
}

/**
 * "3 runs", "1 run".
 * @param {number} count
 */
export function runCount(count) {
  return `${count} run${count === 1 ? "" : "s"}`;
}

/**
 * The last part of a session's path: what a person recognises in a narrow sidebar.
 * @param {string} session
 */
export function sessionName(session) {
  const parts = session.split("/").filter(Boolean);
  return parts.length > 0 ? parts[parts.length - 1] : session;
}

/**
 * A conversation's id among widgets and in a saved layout.
 * @param {string} session
 * @param {string} agent
 */
export function conversationKey(session, agent) {
  return `${agent}\u0000${session}`;
}

/**
 * The caller's conversations, newest first, a page at a time; a click opens one.
 */
export class ConversationList {
  /**
   * @param {{baseUrl: string, open: (conversation: Conversation) => void, fetch?: Fetch, now?: () => number}} options
   */
  constructor(options) {
    this.baseUrl = withSlash(options.baseUrl);
    this.open = options.open;
    this.fetch = options.fetch || apiFetch;
    this.now = options.now || Date.now;
    /** @type {Conversation[]} */
    this.conversations = [];
    /** @type {string | null} */
    this.next = null;
    this.generation = 0;
    this.node = element("div", "agentruns-conversations");
    this.message = element("div", "agentruns-panel-message");
    this.message.hidden = true;
    this.empty = element("div", "agentruns-panel-empty", NO_CONVERSATIONS);
    this.empty.hidden = true;
    this.list = element("div", "agentruns-conversations-list");
    this.moreButton = button("More", "agentruns-conversations-more");
    this.moreButton.hidden = true;
    this.moreButton.addEventListener("click", () => void this.more());
    this.node.append(this.message, this.empty, this.list, this.moreButton);
  }

  /**
   * Read the list again, as many as are shown (at least a page): a conversation moves up when it
   * gets a run, and the pages More added stay.
   */
  async load() {
    this.generation += 1;
    const generation = this.generation;
    const page = await this._page(null, Math.min(MAX_CONVERSATIONS, Math.max(CONVERSATIONS_PAGE, this.conversations.length)));
    if (page === null || generation !== this.generation) return;
    this.conversations = page.conversations;
    this.next = page.next;
    this.render();
  }

  /** The next page, below the ones shown. */
  async more() {
    if (this.next === null) return;
    const generation = this.generation;
    const page = await this._page(this.next, CONVERSATIONS_PAGE);
    if (page === null || generation !== this.generation) return;
    const known = new Set(this.conversations.map((c) => conversationKey(c.session, c.agent)));
    this.conversations.push(...page.conversations.filter((c) => !known.has(conversationKey(c.session, c.agent))));
    this.next = page.next;
    this.render();
  }

  /**
   * @param {string | null} before
   * @param {number} limit
   * @returns {Promise<{conversations: Conversation[], next: string | null} | null>}
   */
  async _page(before, limit) {
    const query = new URLSearchParams({ limit: String(limit) });
    if (before !== null) query.set("before", before);
    try {
      const response = await this.fetch(`${conversationsUrl(this.baseUrl)}?${query}`);
      if (!response.ok) throw new Error(await errorMessage(response));
      const page = await response.json();
      this.message.hidden = true;
      const conversations = (Array.isArray(page?.conversations) ? page.conversations : []).filter(
        (/** @type {any} */ c) => typeof c?.session === "string" && typeof c?.agent === "string",
      );
      return { conversations, next: typeof page?.next === "string" && page.next ? page.next : null };
    } catch (error) {
      this.message.hidden = false;
      this.message.textContent = `Could not list the conversations: ${error instanceof Error ? error.message : error}`;
      return null;
    }
  }

  /** Draw the rows (ages move on each time). */
  render() {
    const now = this.now();
    this.list.replaceChildren(
      ...this.conversations.map((conversation) => {
        const row = element("div", "agentruns-conversation");
        row.tabIndex = 0;
        row.setAttribute("role", "button");
        row.dataset.session = conversation.session;
        row.dataset.agent = conversation.agent;
        const title = element("div", "agentruns-conversation-title", conversation.title || "(no title)");
        const line = element("div", "agentruns-conversation-line");
        const updated = parseTime(conversation.updated_at);
        line.append(
          element("span", "agentruns-conversation-agent", conversation.agent),
          element("span", "agentruns-conversation-session", sessionName(conversation.session)),
          element("span", "agentruns-conversation-runs", runCount(Number(conversation.runs) || 0)),
          element("span", "agentruns-conversation-age", updated === null ? "" : formatAgo(updated, now)),
        );
        row.title = `${conversation.session} · ${conversation.agent}`;
        row.append(title, line);
        row.addEventListener("click", () => this.open(conversation));
        row.addEventListener("keydown", (event) => {
          if (event.key === "Enter") this.open(conversation);
        });
        return row;
      }),
    );
    this.empty.hidden = this.conversations.length > 0 || !this.message.hidden;
    this.moreButton.hidden = this.next === null;
  }
}

/**
 * What a conversation's view needs from where it is shown.
 * @typedef {{
 *   baseUrl: string,
 *   session: string,
 *   agent: string,
 *   fetch?: Fetch,
 *   actions?: RunActions,
 *   agents?: AgentDirectory,
 *   makeView?: (host: any, el: HTMLElement) => ShownRun,
 *   openBeside?: () => void,
 * }} ConversationOptions
 * `openBeside`: dock the view beside the notebook (the right sidebar); no button without it.
 */

/**
 * A conversation as a chat: its runs oldest first, each its own run view (Cancel, Run again),
 * "Earlier" for the runs before, and one reply box at the bottom.
 */
export class ConversationView {
  /** @param {ConversationOptions} options */
  constructor(options) {
    this.baseUrl = withSlash(options.baseUrl);
    this.session = options.session;
    this.agent = options.agent;
    this.fetch = options.fetch || apiFetch;
    this.actionsGiven = options.actions || null;
    this.agents = options.agents || pageAgents(this.baseUrl);
    this.makeView = options.makeView || null;
    /** @type {{runId: string, status: string, created: string, input: any, metadata: any, node: HTMLElement, view: ShownRun}[]} */
    this.entries = [];
    /** The cursor of the page before the oldest run read; null once the session's first run is read. */
    /** @type {string | null} */
    this.next = null;
    this.loaded = false;
    this.disposed = false;
    this.sent = 0;

    this.node = element("div", "agentruns-runpage agentruns-conversation-view");
    const head = element("div", "agentruns-conversation-head");
    head.append(
      element("span", "agentruns-conversation-agent", this.agent),
      element("span", "agentruns-conversation-session", this.session),
    );
    /** @type {HTMLButtonElement | null} */
    this.besideButton = null;
    if (options.openBeside) {
      const beside = options.openBeside;
      this.besideButton = button("Open beside", "agentruns-conversation-beside");
      this.besideButton.title = "Dock this conversation in the right sidebar, beside the notebook";
      this.besideButton.addEventListener("click", () => beside());
      head.append(element("span", "agentruns-spacer"), this.besideButton);
    }
    this.earlierButton = button("Earlier", "agentruns-conversation-earlier");
    this.earlierButton.hidden = true;
    this.earlierButton.title = "Show the runs before these";
    this.earlierButton.addEventListener("click", () => void this.earlier());
    this.message = element("div", "agentruns-panel-message");
    this.message.hidden = true;
    this.list = element("div", "agentruns-conversation-runs");
    this.box = new FollowUpBox(
      (text, chosen) => this._send(text, chosen),
      agentMentions(() => this.baseUrl, () => this.agents, () => this.agent, () => this.home(), this.fetch),
    );
    this.box.setReason("Loading the conversation…");
    // The box is drawn as the run views' own reply box is.
    const reply = element("div", "agentruns-run agentruns-conversation-reply");
    reply.append(this.box.node);
    this.node.append(head, this.message, this.earlierButton, this.list, reply);
  }

  /** Read the newest page of the session's runs and show the agent's, oldest first. */
  async load() {
    await this._read(null);
    this.loaded = true;
    this._reason();
    void this._offer();
  }

  /** Runs of the conversation started elsewhere since (a cell, another tab): below the ones shown. */
  async refresh() {
    if (!this.loaded || this.disposed) return;
    const newest = this.entries.reduce((latest, entry) => (entry.created > latest ? entry.created : latest), "");
    const query = new URLSearchParams({ session: this.session, limit: String(CONVERSATION_PAGE) });
    let page;
    try {
      const response = await this.fetch(`${runsUrl(this.baseUrl)}?${query}`);
      if (!response.ok) return;
      page = await response.json();
    } catch {
      return; // the next look tries again
    }
    if (this.disposed) return;
    const runs = (Array.isArray(page?.runs) ? page.runs : []).filter(
      (/** @type {Run} */ run) => run && run.agent === this.agent && String(run.created_at || "") > newest,
    );
    for (const run of runs.reverse()) this._add(run, "bottom");
    if (runs.length > 0) this._reason();
  }

  /** The page of runs before the oldest shown, above them. */
  async earlier() {
    if (this.next !== null) await this._read(this.next);
  }

  /** The id of the conversation's first run as far as read: what a reply follows up. */
  rootId() {
    const first = this.entries[0];
    if (first === undefined) return null;
    return threadRoot(/** @type {Run} */ ({ run_id: first.runId, metadata: first.metadata }));
  }

  /** The directory of the notebook the conversation works in now (its newest run's), "" when none. */
  home() {
    const last = this.entries[this.entries.length - 1];
    return runHome({ session: this.session, metadata: last === undefined ? {} : last.metadata });
  }

  dispose() {
    this.disposed = true;
    for (const entry of this.entries) entry.view.dispose();
    this.entries = [];
    this.list.replaceChildren();
  }

  /** @param {string | null} before */
  async _read(before) {
    const query = new URLSearchParams({ session: this.session, limit: String(CONVERSATION_PAGE) });
    if (before !== null) query.set("before", before);
    /** @type {any} */
    let page;
    try {
      const response = await this.fetch(`${runsUrl(this.baseUrl)}?${query}`);
      if (!response.ok) throw new Error(await errorMessage(response));
      page = await response.json();
    } catch (error) {
      this.message.hidden = false;
      this.message.textContent = `Could not read the conversation: ${error instanceof Error ? error.message : error}`;
      return;
    }
    if (this.disposed) return;
    this.message.hidden = true;
    const runs = (Array.isArray(page?.runs) ? page.runs : []).filter((/** @type {Run} */ run) => run && run.agent === this.agent);
    // The page is newest first: each goes above the ones shown, the oldest at the top.
    for (const run of runs) this._add(run, "top");
    this.next = typeof page?.next === "string" && page.next ? page.next : null;
    this.earlierButton.hidden = this.next === null;
  }

  /**
   * @param {Run} run
   * @param {"top" | "bottom"} where
   */
  _add(run, where) {
    if (this.entries.some((entry) => entry.runId === run.run_id)) return;
    const node = element("div", "agentruns-conversation-run");
    node.dataset.runId = run.run_id;
    const entry = {
      runId: run.run_id,
      status: run.status,
      created: String(run.created_at || ""),
      input: run.input,
      metadata: run.metadata || {},
      node,
      view: /** @type {ShownRun} */ (/** @type {unknown} */ (null)),
    };
    entry.view = this._view(entry, node);
    if (where === "top") {
      this.entries.unshift(entry);
      this.list.prepend(node);
    } else {
      this.entries.push(entry);
      this.list.append(node);
    }
    entry.view.attach(run.run_id);
  }

  /**
   * @param {{runId: string, status: string, created: string}} entry
   * @param {HTMLElement} node
   * @returns {ShownRun}
   */
  _view(entry, node) {
    const base = this.baseUrl;
    const host = pageHost(() => entry.runId, () => base, {
      // Run again: the new run takes the old one's place in the chat.
      ranAgain: (run) => {
        entry.runId = run.run_id;
        entry.status = run.status;
        entry.created = String(run.created_at || entry.created);
        view.attach(run.run_id);
        this._reason();
      },
      shown: (/** @type {{status: string}} */ state) => {
        entry.status = state.status;
        this._reason();
      },
    });
    const view = this.makeView !== null ? this.makeView(host, node) : defaultView(host, node);
    return view;
  }

  _reason() {
    if (!this.loaded) return;
    const runs = this.entries.map((entry) => ({ status: entry.status }));
    const root = this.rootId();
    this.box.setReason(
      root === null ? "This conversation has no run of its agent to continue." : whyNot(/** @type {Run} */ ({ run_id: root, session: this.session }), runs),
    );
  }

  async _offer() {
    let offered;
    try {
      offered = await this.agents.offered(this.agent);
    } catch {
      return; // no pickers: the agent's own mode and model
    }
    if (!this.disposed) this.box.pickers.show(offered, this.entries.map((entry) => entry.input));
  }

  get actions() {
    return this.actionsGiven || new RunActions({ baseUrl: this.baseUrl });
  }

  /**
   * @param {string} text
   * @param {import("./thread.js").Chosen} chosen
   * @returns {Promise<string | null>}
   */
  async _send(text, chosen) {
    const rootId = this.rootId();
    if (rootId === null) return "the conversation has no run to follow up";
    // Where it works now: the notebook and kernel of its newest run.
    const last = this.entries[this.entries.length - 1];
    const body = followUpBody(/** @type {Run} */ ({ run_id: rootId, agent: this.agent, session: this.session, metadata: last.metadata }), text, chosen);
    const picked = chosenKey(chosen);
    this.sent += 1;
    const outcome = await this.actions.start(`conversation ${rootId} ${this.entries.length} ${picked} ${text}`, body);
    if (outcome.run === null) {
      this.sent -= 1;
      return outcome.problem;
    }
    if (!this.disposed) this._add({ ...outcome.run, metadata: outcome.run.metadata || body.metadata, input: outcome.run.input ?? body.input }, "bottom");
    this._reason();
    return null;
  }
}

/**
 * A run's own view, without a thread of its own: the chat is its thread.
 * @param {any} host
 * @param {HTMLElement} node
 * @returns {ShownRun}
 */
function defaultView(host, node) {
  return new RunView(host, node, { thread: false });
}
