// What a run says to a person, in one place: its title, its timing, its answers, its end.
//
// The run view and the runs panel say these things in the same words as the
// record and the command line (jupyter_agentruns/words.py); both are held to
// tests/vectors/words/cases.json. Every function returns plain text: the
// views put it in the page as text (textContent), never as markup.

import { hasOwn, isPlainObject } from "./json.js";
import { isTerminal } from "./status.js";

/** A title made from a prompt is its first line, cut at this many characters. */
export const TITLE_LIMIT = 80;

// jupyter_server names the user of a token-only request "Anonymous <a moon
// of Jupiter>", a new one per request: a name that stands for nobody.
const ANONYMOUS = /^Anonymous [A-Z][a-z]+$/;

// An approval's choices are verbs; what was done is said in the past tense.
/** @type {Record<string, string>} */
const DONE = {
  approve: "approved",
  deny: "denied",
  allow: "allowed",
  reject: "rejected",
  accept: "accepted",
  decline: "declined",
  cancel: "cancelled",
  "run it again": "run again",
  "skip it": "skipped",
  "stop the run": "stopped",
};

/**
 * @typedef {{optionId: string, name: string, kind: string}} PermissionOption
 * @typedef {import("./reducer.js").Input} Input
 */

/**
 * What a run is about: the run object's `title`, else `metadata.title` if
 * given, else the first line of `input.prompt` (at most 80 characters), else the agent's name.
 * @param {any} run
 * @returns {string}
 */
export function runTitle(run) {
  if (!isPlainObject(run)) return "";
  if (typeof run.title === "string" && run.title) return run.title;
  const given = isPlainObject(run.metadata) ? run.metadata.title : null;
  if (typeof given === "string" && given.trim()) return given;
  const prompt = isPlainObject(run.input) ? run.input.prompt : null;
  if (typeof prompt === "string" && prompt.trim()) {
    const line = prompt.trim().split(/\r\n|\r|\n/)[0].trim();
    return [...line].length <= TITLE_LIMIT ? line : `${[...line].slice(0, TITLE_LIMIT - 1).join("")}…`;
  }
  return typeof run.agent === "string" ? run.agent : "";
}

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
 * A time of day as the views show it ("14:05").
 * @param {number} ms since the epoch
 */
export function clockTime(ms) {
  // One formatter for the page: toLocaleTimeString makes one for each call, and a
  // notebook of many runs shows a time in each.
  clockFormat ??= new Intl.DateTimeFormat([], { hour: "2-digit", minute: "2-digit" });
  return clockFormat.format(new Date(ms));
}

/** @type {Intl.DateTimeFormat | undefined} */
let clockFormat;

/**
 * @param {string | null | undefined} text
 * @returns {number | null}
 */
function parsed(text) {
  if (!text) return null;
  const ms = Date.parse(text);
  return Number.isNaN(ms) ? null : ms;
}

/**
 * How long a run ran: "took 3.4 s", "running for 4.1 s", "waiting for an
 * answer (since 14:05)", "not started yet", "never started".
 * @param {{status: string, startedAt?: string | null, finishedAt?: string | null, waitingSince?: string | null}} run
 * @param {number} now ms since the epoch
 * @returns {string}
 */
export function timingWords(run, now) {
  const started = parsed(run.startedAt);
  if (started === null) return isTerminal(run.status) ? "never started" : "not started yet";
  if (run.status === "waiting") {
    const since = parsed(run.waitingSince);
    return since === null ? "waiting for an answer" : `waiting for an answer since ${clockTime(since)}`;
  }
  const finished = parsed(run.finishedAt);
  if (isTerminal(run.status) && finished !== null) return `took ${formatDuration(finished - started)}`;
  return `running for ${formatDuration(now - started)}`;
}

/**
 * A live run's progress: "searching 40%"; "" for a run that ended (its last
 * progress was the phase it was in then, not where it stopped).
 * @param {string} status
 * @param {any} progress
 * @returns {string}
 */
export function progressWords(status, progress) {
  if (isTerminal(status) || !isPlainObject(progress)) return "";
  const fraction = progress.fraction;
  const percent = typeof fraction === "number" && fraction >= 0 && fraction <= 1 ? `${Math.round(fraction * 100)}%` : "";
  const message = typeof progress.message === "string" ? progress.message : "";
  return message ? `${message} ${percent}`.trim() : percent;
}

/**
 * Who answered, when that names a person: not a token login's anonymous name.
 * @param {unknown} by
 * @returns {string | null}
 */
export function person(by) {
  if (typeof by !== "string" || !by.trim() || ANONYMOUS.test(by.trim())) return null;
  return by;
}

/**
 * A permission question's options by id, or null for any other question.
 * @param {Input} input
 * @returns {Map<string, PermissionOption> | null}
 */
export function permissionOptions(input) {
  if (input.kind !== "permission" || !isPlainObject(input.details)) return null;
  /** @type {Map<string, PermissionOption>} */
  const options = new Map();
  const listed = input.details.options;
  for (const option of Array.isArray(listed) ? listed : []) {
    if (!isPlainObject(option) || typeof option.optionId !== "string") continue;
    const name = typeof option.name === "string" && option.name.trim() ? option.name : option.optionId;
    options.set(option.optionId, { optionId: option.optionId, name, kind: typeof option.kind === "string" ? option.kind : "" });
  }
  return options;
}

/**
 * What a choice is called: a permission option's name, an in-doubt answer in words, else the choice itself.
 * @param {Input} input
 * @param {string} choice
 * @returns {string}
 */
export function choiceName(input, choice) {
  const option = permissionOptions(input)?.get(choice);
  if (option) return option.name;
  return input.kind === "in_doubt" && hasOwn(IN_DOUBT_CHOICES, choice) ? IN_DOUBT_CHOICES[choice] : choice;
}

// What a person answers about a step its server was cut off in (c.AgentRuns.in_doubt = "ask").
/** @type {Record<string, string>} */
const IN_DOUBT_CHOICES = { run_again: "Run it again", skip: "Skip it", stop: "Stop the run" };

/**
 * A question's answer: "approved by ann", "denied: not now", "no answer in time".
 * @param {Input} input
 * @returns {string}
 */
export function answerWords(input) {
  if (input.status === "open") return "waiting for an answer";
  if (input.choice === null || input.choice === undefined) {
    return input.reason === "timeout" ? "no answer in time" : "not answered";
  }
  const name = choiceName(input, String(input.choice));
  let text = DONE[name.trim().toLowerCase()] ?? name;
  const by = person(input.by);
  if (by !== null) text += ` by ${by}`;
  if (typeof input.note === "string" && input.note.trim()) text += `: ${input.note}`;
  return text;
}

/**
 * A cancelled run's end: "cancelled", "cancelled from the notebook",
 * "cancelled: interrupted by run_…" (a reason that starts with the word is not said twice).
 * @param {any} reason
 * @returns {string}
 */
export function cancelledWords(reason) {
  if (reason === null || reason === undefined || reason === "") return "cancelled";
  if (isPlainObject(reason) && typeof reason.interrupted_by === "string") return `cancelled: interrupted by ${reason.interrupted_by}`;
  const text = typeof reason === "string" ? reason : JSON.stringify(reason);
  if (/^cancell?ed\b/i.test(text.trim())) return text.trim();
  return `cancelled: ${text}`;
}

/**
 * What a view says of a run that re-running its cell found again (the same
 * idempotency key): the same run, and how to get a new one once it has ended.
 * @param {string} status
 * @returns {string}
 */
export function sameRunWords(status) {
  return isTerminal(status) ? "the same run as before: Run again for a new one" : "the same run as before, still going";
}
