// A run whose agent has said nothing for a while: every view says so.
//
// "Said nothing" counts from the run's last event (heartbeats are no events),
// known from the run object's `last_event_at` and from each event's `ts`. Only
// a `running` run can be silent: one waiting for a person's answer is not stuck.

/** A view says nothing about a silence shorter than this. */
export const SILENCE_SHOWN_AFTER_MS = 60_000;

/**
 * "1 min", "12 min", "1 h 5 min": how long, in whole minutes.
 * @param {number} ms
 */
export function silenceSpan(ms) {
  const minutes = Math.floor(ms / 60_000);
  if (minutes < 60) return `${minutes} min`;
  return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

/**
 * How long a running run's agent has said nothing (ms), or null when it is not running or the time is unknown.
 * @param {{status: string, lastEventAt?: string | null}} state
 * @param {number} now ms since the epoch
 * @returns {number | null}
 */
export function silenceMs(state, now) {
  if (state.status !== "running" || typeof state.lastEventAt !== "string") return null;
  const last = Date.parse(state.lastEventAt);
  return Number.isNaN(last) ? null : Math.max(0, now - last);
}

/**
 * "no word from the agent for 2 min", or "" while the agent speaks (or the run is not running).
 * @param {{status: string, lastEventAt?: string | null}} state
 * @param {number} now ms since the epoch
 * @returns {string}
 */
export function silenceWords(state, now) {
  const ms = silenceMs(state, now);
  return ms === null || ms < SILENCE_SHOWN_AFTER_MS ? "" : `no word from the agent for ${silenceSpan(ms)}`;
}
