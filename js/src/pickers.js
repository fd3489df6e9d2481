// The agent's modes and models as small pickers: beside the reply box and in New run.
//
// What an agent offers comes from `GET agents` (`modes`, `models`, `current`),
// read once per page and shared by every box and form. A picker shows only
// where the agent offers more than one; what it holds goes into the input
// as `mode` / `model`. A view's meta line says which a run used, from its input.

import { apiFetch, errorMessage, withSlash } from "./api.js";
import { element } from "./dom.js";

/**
 * @typedef {import("./api.js").Fetch} Fetch
 * @typedef {{id: string, name: string, description?: string}} Choice
 * @typedef {{mode: Choice[], model: Choice[], current: {mode?: string, model?: string}}} Offered
 */

/** The input fields a picker fills, in the order they show. */
export const CATEGORIES = /** @type {const} */ (["mode", "model"]);
const LABELS = { mode: "Mode", model: "Model" };

/**
 * What an agent of `GET agents` offers, its malformed entries left out.
 * @param {any} agent
 * @returns {Offered}
 */
export function offeredBy(agent) {
  /** @type {Offered} */
  const offered = { mode: [], model: [], current: {} };
  for (const category of CATEGORIES) {
    const listed = agent && Array.isArray(agent[`${category}s`]) ? agent[`${category}s`] : [];
    for (const choice of listed) {
      if (typeof choice?.id !== "string" || !choice.id || offered[category].some((known) => known.id === choice.id)) continue;
      /** @type {Choice} */
      const kept = { id: choice.id, name: typeof choice.name === "string" && choice.name ? choice.name : choice.id };
      if (typeof choice.description === "string" && choice.description) kept.description = choice.description;
      offered[category].push(kept);
    }
    const current = agent?.current?.[category];
    if (typeof current === "string" && offered[category].some((choice) => choice.id === current)) offered.current[category] = current;
  }
  return offered;
}

/**
 * What a picker holds first: the latest run's choice among `inputs` (newest last), else the agent's current one.
 * @param {Offered} offered
 * @param {"mode" | "model"} category
 * @param {any[]} inputs the inputs of the conversation's runs, oldest first
 * @returns {string} "" when the agent offers none
 */
export function preferred(offered, category, inputs) {
  const ids = offered[category].map((choice) => choice.id);
  for (let i = inputs.length - 1; i >= 0; i--) {
    const chosen = inputs[i]?.[category];
    if (typeof chosen === "string" && ids.includes(chosen)) return chosen;
  }
  return offered.current[category] || ids[0] || "";
}

/**
 * The words a view says of the mode, model and files its run used ("" when its input names none).
 * @param {any} input
 * @returns {string}
 */
export function choiceWords(input) {
  const words = [];
  for (const category of CATEGORIES) {
    const chosen = input?.[category];
    if (typeof chosen === "string" && chosen) words.push(`${category} ${chosen}`);
  }
  const files = Array.isArray(input?.files) ? input.files.filter((/** @type {any} */ path) => typeof path === "string" && path) : [];
  if (files.length > 0) words.push(`${files.length === 1 ? "file" : "files"} ${files.join(", ")}`);
  return words.join(" · ");
}

/** `GET agents`, read once per page for one server and shared. */
export class AgentDirectory {
  /** @param {{baseUrl: string, fetch?: Fetch}} options */
  constructor(options) {
    this.baseUrl = withSlash(options.baseUrl);
    this.fetch = options.fetch || apiFetch;
    /** @type {Promise<any> | null} */
    this.reading = null;
  }

  /**
   * The answer of `GET agents` (a failed read is tried again at the next call).
   * @returns {Promise<any>}
   */
  answer() {
    if (this.reading === null) {
      this.reading = this._read().catch((error) => {
        this.reading = null;
        throw error;
      });
    }
    return this.reading;
  }

  /**
   * What the agent `name` offers (nothing when the server does not list it).
   * @param {string} name
   * @returns {Promise<Offered>}
   */
  async offered(name) {
    return offeredBy(await this.agent(name));
  }

  /**
   * The agent `name` as `GET agents` describes it (undefined when the server does not list it).
   * @param {string} name
   * @returns {Promise<any>}
   */
  async agent(name) {
    const answer = await this.answer();
    const agents = Array.isArray(answer?.agents) ? answer.agents : [];
    return agents.find((/** @type {any} */ agent) => agent?.name === name);
  }

  /** The next read asks the server again (an agent says its choices once it has opened a session). */
  forget() {
    this.reading = null;
  }

  async _read() {
    const response = await this.fetch(`${this.baseUrl}api/agentruns/agents`);
    if (!response.ok) throw new Error(await errorMessage(response));
    return response.json();
  }
}

const DIRECTORIES_KEY = "__jupyterAgentrunsAgents";

/**
 * The page's agent directory for the server at `baseUrl` (shared by every copy of this module).
 * @param {string} baseUrl
 * @returns {AgentDirectory}
 */
export function pageAgents(baseUrl) {
  const page = /** @type {Record<string, any>} */ (globalThis);
  if (!(page[DIRECTORIES_KEY] instanceof Map)) page[DIRECTORIES_KEY] = new Map();
  const directories = /** @type {Map<string, AgentDirectory>} */ (page[DIRECTORIES_KEY]);
  const key = withSlash(baseUrl);
  let directory = directories.get(key);
  if (directory === undefined) {
    directory = new AgentDirectory({ baseUrl: key });
    directories.set(key, directory);
  }
  return directory;
}

/** A labelled `<select>` for each of mode and model; hidden where the agent offers fewer than two. */
export class ChoicePickers {
  /** @param {string} className the class of its node, for the place it sits in */
  constructor(className) {
    this.node = element("span", `agentruns-pickers ${className}`);
    /** @type {Record<"mode" | "model", HTMLSelectElement>} */
    this.selects = /** @type {any} */ ({});
    /** @type {Record<"mode" | "model", HTMLElement>} */
    this.labels = /** @type {any} */ ({});
    for (const category of CATEGORIES) {
      const select = /** @type {HTMLSelectElement} */ (element("select", `agentruns-picker agentruns-picker-${category}`));
      select.setAttribute("aria-label", `The agent's ${category}`);
      select.title = `The agent's ${category} for the next run`;
      // Its keys are the picker's, not the notebook's shortcuts.
      select.addEventListener("keydown", (event) => event.stopPropagation());
      const label = element("label", "agentruns-picker-field");
      label.append(element("span", "agentruns-picker-label", LABELS[category]), select);
      this.selects[category] = select;
      this.labels[category] = label;
      this.node.append(label);
    }
    this.show({ mode: [], model: [], current: {} }, []);
  }

  /**
   * Offer what the agent offers, each set to what `inputs` chose last (else the agent's current one).
   * @param {Offered} offered
   * @param {any[]} inputs
   */
  show(offered, inputs) {
    for (const category of CATEGORIES) {
      const select = this.selects[category];
      const choices = offered[category];
      select.replaceChildren(
        ...choices.map((choice) => {
          const option = /** @type {HTMLOptionElement} */ (element("option", "", choice.name));
          option.value = choice.id;
          if (choice.description) option.title = choice.description;
          return option;
        })
      );
      select.value = preferred(offered, category, inputs);
      this.labels[category].hidden = choices.length < 2;
    }
    this.node.hidden = CATEGORIES.every((category) => this.labels[category].hidden);
  }

  /**
   * What the pickers shown hold, for the input.
   * @returns {{mode?: string, model?: string}}
   */
  chosen() {
    /** @type {{mode?: string, model?: string}} */
    const chosen = {};
    for (const category of CATEGORIES) {
      if (!this.labels[category].hidden && this.selects[category].value) chosen[category] = this.selects[category].value;
    }
    return chosen;
  }

  /** @param {boolean} disabled */
  setDisabled(disabled) {
    for (const category of CATEGORIES) this.selects[category].disabled = disabled;
  }
}
