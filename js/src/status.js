// Run statuses: which are terminal, which still need following.

/** Every run status, in the order a run meets them (the runs panel's filter lists them so). */
export const STATUSES = Object.freeze([
  "queued",
  "running",
  "waiting",
  "cancelling",
  "succeeded",
  "failed",
  "cancelled",
  "interrupted",
]);

/** Terminal event types and the run status each one ends in. */
export const TERMINAL_TYPES = Object.freeze({
  "run.succeeded": "succeeded",
  "run.failed": "failed",
  "run.cancelled": "cancelled",
  "run.interrupted": "interrupted",
});

/** @type {Set<string>} */
const TERMINAL_STATUSES = new Set(Object.values(TERMINAL_TYPES));

/** Statuses of a run that has not ended: the view follows it and offers Cancel. */
export const ACTIVE_STATUSES = new Set(["queued", "running", "waiting", "cancelling"]);

/**
 * True when `status` is one of the four terminal statuses.
 * @param {unknown} status
 * @returns {boolean}
 */
export function isTerminal(status) {
  return typeof status === "string" && TERMINAL_STATUSES.has(status);
}

/**
 * True when `type` is a terminal event type.
 * @param {string} type
 * @returns {boolean}
 */
export function isTerminalType(type) {
  return Object.prototype.hasOwnProperty.call(TERMINAL_TYPES, type);
}
