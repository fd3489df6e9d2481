// The caller's schedules, a small section of the runs panel: each one's agent,
// when it runs, its next time and its last runs (a click opens a run).
//
// Plain DOM, as the panel. Hidden while there is no schedule (and when the
// server has no schedules at all, an older one): the panel stays as it was.

import { apiFetch, withSlash } from "./api.js";
import { element, formatAgo, parseTime } from "./dom.js";

/** The runs of each schedule shown (the server lists its newest five). */
export const RUNS_SHOWN = 5;

/**
 * @typedef {{run_id: string, status: string, created_at: string, finished_at: string | null}} ScheduledRun
 * @typedef {{
 *   schedule_id: string, agent: string, cron: string, timezone: string, session: string | null,
 *   paused: boolean, next_at: string | null, last_error: string | null, skipped: number,
 *   last_runs: ScheduledRun[],
 * }} Schedule
 * @typedef {(url: string, init?: any) => Promise<Response>} Fetch
 */

/**
 * The URL of the schedules under `baseUrl`.
 * @param {string} baseUrl
 */
export function schedulesUrl(baseUrl) {
  return `${withSlash(baseUrl)}api/agentruns/schedules`;
}

/**
 * When a schedule runs next, in words: "paused", "next in 5 min", "next now".
 * @param {Schedule} schedule
 * @param {number} now
 */
export function nextWords(schedule, now) {
  if (schedule.paused) return "paused";
  const next = parseTime(schedule.next_at);
  if (next === null) return "";
  const seconds = Math.floor((next - now) / 1000);
  if (seconds < 1) return "next now";
  if (seconds < 60) return `next in ${seconds} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `next in ${minutes} min`;
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return `next in ${hours} h`;
  return `next in ${Math.floor(hours / 24)} days`;
}

/**
 * Whether a value from the server reads as a schedule (anything else is left out).
 * @param {any} value
 * @returns {value is Schedule}
 */
function isSchedule(value) {
  return typeof value?.schedule_id === "string" && typeof value?.agent === "string" && typeof value?.cron === "string";
}

export class ScheduleList {
  /**
   * @param {{baseUrl: string, openRun?: ((runId: string) => void) | null, fetch?: Fetch, now?: () => number}} options
   */
  constructor(options) {
    this.baseUrl = withSlash(options.baseUrl);
    this.openRun = options.openRun || null;
    this.fetch = options.fetch || apiFetch;
    this.now = options.now || Date.now;
    /** @type {Schedule[]} */
    this.schedules = [];
    this.generation = 0;
    this.node = element("details", "agentruns-schedules");
    this.node.hidden = true;
    this.summary = element("summary", "agentruns-schedules-summary", "Schedules");
    this.list = element("div", "agentruns-schedules-list");
    this.node.append(this.summary, this.list);
  }

  /** Read the schedules again; an error leaves the section as it was. */
  async load() {
    this.generation += 1;
    const generation = this.generation;
    let answer;
    try {
      const response = await this.fetch(schedulesUrl(this.baseUrl));
      if (!response.ok) return; // a server without schedules, or a passing failure: the next look
      answer = await response.json();
    } catch {
      return;
    }
    if (generation !== this.generation) return;
    this.schedules = (Array.isArray(answer?.schedules) ? answer.schedules : []).filter(isSchedule);
    this.render();
  }

  render() {
    const now = this.now();
    this.node.hidden = this.schedules.length === 0;
    this.summary.textContent = `Schedules (${this.schedules.length})`;
    this.list.replaceChildren(...this.schedules.map((schedule) => this._row(schedule, now)));
  }

  /**
   * @param {Schedule} schedule
   * @param {number} now
   */
  _row(schedule, now) {
    const row = element("div", "agentruns-schedule");
    row.dataset.scheduleId = schedule.schedule_id;
    row.dataset.paused = String(schedule.paused === true);
    const head = element("div", "agentruns-schedule-head");
    head.append(
      element("span", "agentruns-schedule-agent", schedule.agent),
      element("code", "agentruns-schedule-cron", schedule.cron),
      element("span", "agentruns-schedule-zone", schedule.timezone),
    );
    const next = element("span", "agentruns-schedule-next", nextWords(schedule, now));
    if (schedule.next_at) next.title = `Next: ${schedule.next_at}`;
    head.append(next);
    const runs = element("div", "agentruns-schedule-runs");
    const lastRuns = Array.isArray(schedule.last_runs) ? schedule.last_runs.slice(0, RUNS_SHOWN) : [];
    if (lastRuns.length === 0) runs.append(element("span", "agentruns-schedule-none", "no run yet"));
    for (const run of lastRuns) {
      const chip = /** @type {HTMLButtonElement} */ (element("button", "agentruns-chip agentruns-schedule-run", String(run.status)));
      chip.type = "button";
      chip.dataset.status = String(run.status);
      chip.dataset.kind = String(run.status);
      chip.dataset.runId = String(run.run_id);
      const created = parseTime(run.created_at);
      chip.title = created === null ? String(run.run_id) : `${run.run_id}, ${formatAgo(created, now)}`;
      const open = this.openRun;
      chip.disabled = open === null;
      if (open !== null) chip.addEventListener("click", () => open(String(run.run_id)));
      runs.append(chip);
    }
    row.append(head, runs);
    if (schedule.last_error) row.append(element("div", "agentruns-schedule-error", `Last time: no run (${schedule.last_error})`));
    return row;
  }
}
