// The event semantics: a run's events reduced to its snapshot.
//
// The twin of jupyter_agentruns/reducer.py; both are held to the same test
// vectors in tests/vectors/.

import { hasOwn, isPlainObject } from "./json.js";

/**
 * @typedef {{id: string, role: string, text: string, done: boolean}} Message
 * @typedef {{type: string, text?: string, path?: string, old_text?: string | null, new_text?: string}} ToolContent
 * @typedef {{call_id: string, name: string, args: any, status: string, result: any, error?: any,
 *   kind?: string, title?: string, content?: ToolContent[]}} Tool
 * @typedef {{content: string, status: string, priority?: string}} PlanEntry
 * @typedef {{fraction: number | null, message: string | null}} Progress
 * @typedef {{input_tokens: number | null, output_tokens: number | null, estimated?: boolean, cost?: number | null}} Usage
 * @typedef {{request_id: string, kind: string | null, title: string | null, details: any, choices: string[] | null,
 *   status: string, choice: string | null, note?: string, by?: string, reason?: string}} Input
 * @typedef {{edit_id: string, notebook?: string, op?: string, cell_id?: string, index?: number | null,
 *   before?: any, after?: any, status?: string}} NotebookEdit
 * @typedef {{messages: Message[], tools: Tool[], progress: Progress | null, usage: Usage | null, inputs?: Input[],
 *   reasoning?: string, plan?: PlanEntry[], edits?: NotebookEdit[]}} Snapshot
 * @typedef {{run_id?: string, seq?: number, type: string, ts?: string, data?: any}} Event
 */

/**
 * The snapshot of a run with no events.
 * @returns {Snapshot}
 */
export function emptySnapshot() {
  return { messages: [], tools: [], progress: null, usage: null };
}

// Python's dict.get(key, fallback), so that absent and null stay as distinct as there.
/**
 * @param {Record<string, any>} data
 * @param {string} key
 * @param {any} [fallback]
 */
function get(data, key, fallback = null) {
  return hasOwn(data, key) ? data[key] : fallback;
}

// Python's data[key]: a missing key is an error, never a silent undefined.
/**
 * @param {Record<string, any>} data
 * @param {string} key
 * @param {string} type
 */
function need(data, key, type) {
  if (!isPlainObject(data) || !hasOwn(data, key)) {
    throw new TypeError(`a ${type} event without ${key}`);
  }
  return data[key];
}

// Python truthiness of a JSON value: the reducer's `data or {}` and `if not ok`.
/** @param {unknown} value */
function truthy(value) {
  if (Array.isArray(value)) return value.length > 0;
  if (isPlainObject(value)) return Object.keys(value).length > 0;
  return Boolean(value);
}

/**
 * @template {Record<string, any>} T
 * @param {T[]} items
 * @param {string} key
 * @param {unknown} value
 * @returns {T | null}
 */
function findLast(items, key, value) {
  // Searching from the end: events almost always concern the newest item.
  for (let i = items.length - 1; i >= 0; i--) {
    if (items[i][key] === value) return items[i];
  }
  return null;
}

/**
 * Apply one event to `snapshot` in place and return it.
 *
 * Unknown event types (`x.*` and future ones) leave the snapshot as it is.
 * @param {Snapshot} snapshot
 * @param {Event} event
 * @returns {Snapshot}
 */
export function applyEvent(snapshot, event) {
  const type = event.type;
  const data = truthy(event.data) ? event.data : {};
  if (type === "message.started") {
    const id = need(data, "message_id", type);
    snapshot.messages.push({ id, role: get(data, "role", "assistant"), text: "", done: false });
  } else if (type === "text.delta") {
    const id = need(data, "message_id", type);
    const delta = need(data, "delta", type);
    if (typeof delta !== "string") throw new TypeError("a text.delta whose delta is not text");
    let message = findLast(snapshot.messages, "id", id);
    if (message === null) {
      // A delta without message.started still carries text worth showing.
      message = { id, role: "assistant", text: "", done: false };
      snapshot.messages.push(message);
    }
    message.text += delta;
  } else if (type === "message.completed") {
    const message = findLast(snapshot.messages, "id", need(data, "message_id", type));
    if (message !== null) message.done = true;
  } else if (type === "tool.started") {
    /** @type {Tool} */
    const tool = {
      call_id: need(data, "call_id", type),
      name: need(data, "name", type),
      args: get(data, "args", {}),
      status: "running",
      result: null,
    };
    // What kind of step it is and what it does, in the agent's words (ACP agents say so).
    for (const name of /** @type {const} */ (["kind", "title"])) {
      const value = get(data, name);
      if (value !== null && value !== undefined) tool[name] = value;
    }
    snapshot.tools.push(tool);
  } else if (type === "tool.completed") {
    const tool = findLast(snapshot.tools, "call_id", need(data, "call_id", type));
    if (tool !== null) {
      const ok = truthy(get(data, "ok", true));
      tool.status = ok ? "completed" : "failed";
      tool.result = get(data, "result");
      if (!ok) tool.error = get(data, "error");
      // What the step showed: text, and the diffs of the files it changed.
      const content = get(data, "content");
      if (content !== null && content !== undefined) tool.content = content;
    }
  } else if (type === "reasoning.delta") {
    const delta = need(data, "delta", type);
    if (typeof delta !== "string") throw new TypeError("a reasoning.delta whose delta is not text");
    // The model's visible thinking, all of it in one text ("reasoning" appears with the first).
    snapshot.reasoning = (typeof snapshot.reasoning === "string" ? snapshot.reasoning : "") + delta;
  } else if (type === "plan.updated") {
    // Each plan replaces the last ("plan" appears with the first).
    const entries = get(data, "entries");
    snapshot.plan = Array.isArray(entries) ? [...entries] : [];
  } else if (type === "progress") {
    snapshot.progress = { fraction: get(data, "fraction"), message: get(data, "message") };
  } else if (type === "usage") {
    /** @type {Usage} */
    const usage = { input_tokens: get(data, "input_tokens"), output_tokens: get(data, "output_tokens") };
    // Counted by the agent, not reported by the model server: the view says so.
    if (truthy(get(data, "estimated", false))) usage.estimated = true;
    // In the currency of the agent's prices (c.OpenAIAgent.prices).
    const cost = get(data, "cost");
    if (typeof cost === "number" && Number.isFinite(cost)) usage.cost = cost;
    snapshot.usage = usage;
  } else if (type === "input.requested") {
    // "inputs" appears with a run's first question (older snapshots have none).
    if (!Array.isArray(snapshot.inputs)) snapshot.inputs = [];
    snapshot.inputs.push({
      request_id: get(data, "request_id"), kind: get(data, "kind"), title: get(data, "title"),
      details: get(data, "details"), choices: get(data, "choices"), status: "open", choice: null,
    });
  } else if (type === "input.resolved") {
    const inputs = Array.isArray(snapshot.inputs) ? snapshot.inputs : [];
    const request = findLast(inputs, "request_id", get(data, "request_id"));
    if (request) {
      request.status = "resolved";
      request.choice = get(data, "choice");
      for (const name of /** @type {const} */ (["note", "by", "reason"])) {
        const value = get(data, name);
        if (value !== null && value !== undefined) request[name] = value;
      }
    }
  } else if (type === "notebook.edit") {
    // "edits" appears with a run's first notebook edit, in order of first appearance;
    // a later event of the same edit_id replaces what the snapshot keeps of it.
    if (!Array.isArray(snapshot.edits)) snapshot.edits = [];
    const edit = /** @type {Record<string, any> | null} */ (findLast(snapshot.edits, "edit_id", get(data, "edit_id")));
    if (edit === null) {
      snapshot.edits.push({ ...data });
    } else {
      for (const name of Object.keys(edit)) delete edit[name];
      Object.assign(edit, data);
    }
  }
  return snapshot;
}

/**
 * Reduce `events` onto a copy of `snapshot` (or an empty one).
 * @param {Iterable<Event>} events
 * @param {Snapshot | null} [snapshot]
 * @returns {Snapshot}
 */
export function reduceEvents(events, snapshot = null) {
  const result = snapshot === null ? emptySnapshot() : structuredClone(snapshot);
  for (const event of events) applyEvent(result, event);
  return result;
}

/**
 * The questions of a run still waiting for an answer.
 * @param {Snapshot} snapshot
 * @returns {Input[]}
 */
export function openInputs(snapshot) {
  return (Array.isArray(snapshot.inputs) ? snapshot.inputs : []).filter((item) => item.status === "open");
}

