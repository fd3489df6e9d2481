// What the run view and the runs panel both build pages from: elements, and
// times, costs and questions put in words.

import { compactJson } from "./json.js";

/**
 * @typedef {import("./reducer.js").Input} Input
 */

/**
 * "1.4 s", "12 s", "3 min 5 s", "2 h 4 min": a duration for a person.
 * @param {number} ms
 * @returns {string}
 */
export function formatDuration(ms) {
  if (ms < 10_000) return `${(Math.max(0, ms) / 1000).toFixed(1)} s`;
  const seconds = Math.floor(ms / 1000);
  if (seconds < 60) return `${seconds} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min ${seconds % 60} s`;
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return `${hours} h ${minutes % 60} min`;
  return `${Math.floor(hours / 24)} days`;
}

/**
 * "just now", "3 min ago", "5 h ago": how long ago `then` was.
 * @param {number} then ms since the epoch
 * @param {number} now ms since the epoch
 * @returns {string}
 */
export function formatAgo(then, now) {
  const seconds = Math.floor((now - then) / 1000);
  if (seconds < 10) return "just now";
  if (seconds < 60) return `${seconds} s ago`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min ago`;
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return `${hours} h ago`;
  return `${Math.floor(hours / 24)} days ago`;
}

/**
 * @param {string | null | undefined} text
 * @returns {number | null}
 */
export function parseTime(text) {
  if (!text) return null;
  const ms = Date.parse(text);
  return Number.isNaN(ms) ? null : ms;
}

/**
 * @param {string} tag
 * @param {string} [className]
 * @param {string} [text]
 * @returns {HTMLElement}
 */
export function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/**
 * @param {string} text
 * @param {string} className
 * @returns {HTMLButtonElement}
 */
export function button(text, className) {
  const node = /** @type {HTMLButtonElement} */ (element("button", `agentruns-button ${className}`, text));
  node.type = "button";
  return node;
}

/**
 * A question the agent asked a person: a button per choice while open, the answer once resolved.
 * @param {Input} input
 * @param {(choice: string, card: HTMLElement) => void} answer
 * @returns {HTMLElement}
 */
export function inputCard(input, answer) {
  const card = element("div", `agentruns-input agentruns-input--${input.status}`);
  card.dataset.requestId = String(input.request_id);
  card.dataset.status = String(input.status);
  const head = element("div", "agentruns-input-head");
  head.append(
    element("span", "agentruns-input-kind", String(input.kind || "question")),
    element("span", "agentruns-input-title", String(input.title || ""))
  );
  card.appendChild(head);
  if (input.details !== null && input.details !== undefined) {
    const text = typeof input.details === "string" ? input.details : compactJson(input.details, 400);
    card.appendChild(element("div", "agentruns-input-details", text));
  }
  if (input.status === "open") {
    const choices = element("div", "agentruns-input-choices");
    for (const choice of Array.isArray(input.choices) ? input.choices : []) {
      const node = button(String(choice), "agentruns-choice");
      node.dataset.choice = String(choice);
      node.addEventListener("click", () => answer(String(choice), card));
      choices.appendChild(node);
    }
    card.appendChild(choices);
  } else {
    card.appendChild(element("div", "agentruns-input-answer", describeAnswer(input)));
  }
  return card;
}

/**
 * @param {Input} input
 * @returns {string}
 */
export function describeAnswer(input) {
  if (input.choice === null || input.choice === undefined) {
    return input.reason === "timeout" ? "no answer in time" : "not answered: the run went on without it";
  }
  let text = `${input.choice}${input.by ? ` by ${input.by}` : ""}`;
  if (input.note) text += `: ${input.note}`;
  return text;
}

/**
 * A cost in the currency of the agent's prices: cents for most, more digits for a fraction of one.
 * @param {number} cost
 */
export function formatCost(cost) {
  if (cost === 0) return "0";
  return cost >= 0.01 ? cost.toFixed(2) : cost.toPrecision(2);
}

/**
 * A token count ("1234", or "1,234" grouped), or "?" for anything that is not one
 * (text, negative, fractional, beyond 2^53: a run's usage is what its agent said).
 * @param {unknown} value
 * @param {boolean} [grouped]
 * @returns {string}
 */
export function formatTokens(value, grouped = false) {
  if (!isTokenCount(value)) return "?";
  return grouped ? /** @type {number} */ (value).toLocaleString("en-US") : String(value);
}

/**
 * @param {unknown} value
 * @returns {boolean}
 */
export function isTokenCount(value) {
  return typeof value === "number" && Number.isInteger(value) && value >= 0 && value <= 2 ** 53;
}

/**
 * @param {unknown} cost
 * @returns {boolean}
 */
export function isCost(cost) {
  return typeof cost === "number" && Number.isFinite(cost) && cost >= 0;
}
