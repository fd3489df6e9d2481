// The host of a run's view shown with no kernel and no saved output behind it:
// a run's page, a follow-up in a thread, a run of a chat. It has nothing to
// save and nothing to re-attach; what it does on Run again and on each drawing
// is its own.

/**
 * @typedef {import("./runstate.js").Run} Run
 * @typedef {import("./runstate.js").RunState} RunState
 */

/**
 * @param {() => string} runId
 * @param {() => string | null} baseUrl
 * @param {{ranAgain: (run: Run, previous: string) => void, shown: (state: RunState) => void}} own
 */
export function pageHost(runId, baseUrl, { ranAgain, shown }) {
  return {
    runId,
    baseUrl,
    reattached: () => false,
    followed: () => "",
    savedRecord: () => null,
    subscribe: () => () => {},
    save: () => {},
    ranAgain,
    shown,
  };
}
