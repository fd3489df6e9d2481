// Small helpers for JSON values as they come off the wire.

/**
 * @param {object} object
 * @param {PropertyKey} key
 */
export const hasOwn = (object, key) => Object.prototype.hasOwnProperty.call(object, key);

/**
 * A JSON object (not null, not an array).
 * @param {unknown} value
 * @returns {value is Record<string, any>}
 */
export function isPlainObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/**
 * A sequence number or cursor: a non-negative safe integer.
 * @param {unknown} value
 * @returns {value is number}
 */
export function isSeq(value) {
  return Number.isSafeInteger(value) && /** @type {number} */ (value) >= 0;
}

/**
 * `value` as one line of JSON, cut to `limit` characters with an ellipsis.
 * @param {unknown} value
 * @param {number} limit
 * @returns {string}
 */
export function compactJson(value, limit) {
  let text;
  try {
    text = JSON.stringify(value);
  } catch {
    text = String(value);
  }
  if (text === undefined) text = String(value);
  return text.length > limit ? `${text.slice(0, limit - 1)}…` : text;
}
