// Reconnecting politely.

/** The server's `retry:` before it has sent one, in ms. */
export const DEFAULT_RETRY_MS = 1000;
/** The longest wait between two reconnects, in ms. */
export const MAX_BACKOFF_MS = 30000;
/** How often a signed-out page tries again, in ms. */
export const SIGNED_OUT_RETRY_MS = 30000;

/**
 * The wait before reconnect number `attempt` (1, 2, ...): exponential, capped,
 * with full jitter above the floor, so a restarted server is not stampeded.
 * @param {number} attempt
 * @param {number} floorMs
 * @param {() => number} random
 * @returns {number}
 */
export function backoffDelay(attempt, floorMs, random) {
  const ceiling = Math.max(floorMs, Math.min(MAX_BACKOFF_MS, floorMs * 2 ** attempt));
  return Math.round(floorMs + random() * (ceiling - floorMs));
}
