// The page's widget models, found by run id.
//
// The labextension's renderer and the anywidget module are separate bundles,
// each with its own copy of these modules: the registry is plain data on
// globalThis, so that every copy sees the same one.

const REGISTRY_KEY = "__jupyterAgentrunsModels";

/**
 * The part of an anywidget model that this front end uses.
 * @typedef {{
 *   get(name: string): any,
 *   set(name: string, value: any): void,
 *   save_changes(): void,
 *   on(event: string, callback: (...args: any[]) => void): void,
 *   off(event: string, callback: (...args: any[]) => void): void,
 * }} WidgetModel
 * @typedef {{models: Map<string, Set<WidgetModel>>, watchers: Map<string, Set<() => void>>}} Registry
 */

/** @returns {Registry} */
function registry() {
  const page = /** @type {Record<string, any>} */ (globalThis);
  if (!page[REGISTRY_KEY]) page[REGISTRY_KEY] = { models: new Map(), watchers: new Map() };
  return page[REGISTRY_KEY];
}

/**
 * @template T
 * @param {Map<string, Set<T>>} map
 * @param {string} key
 * @param {T} item
 */
function add(map, key, item) {
  let items = map.get(key);
  if (items === undefined) {
    items = new Set();
    map.set(key, items);
  }
  items.add(item);
}

/**
 * @template T
 * @param {Map<string, Set<T>>} map
 * @param {string} key
 * @param {T} item
 */
function remove(map, key, item) {
  const items = map.get(key);
  if (items === undefined) return;
  items.delete(item);
  if (items.size === 0) map.delete(key);
}

/** @param {string} runId */
function notify(runId) {
  for (const watcher of [...(registry().watchers.get(runId) || [])]) {
    try {
      watcher();
    } catch (error) {
      console.error("agentruns: a model watcher failed", error);
    }
  }
}

/**
 * Make `model` findable under its `run_id` (kept current when it changes)
 * until the returned function is called.
 * @param {WidgetModel} model
 * @returns {() => void}
 */
export function registerModel(model) {
  const { models } = registry();
  let runId = String(model.get("run_id") || "");
  if (runId) add(models, runId, model);
  notify(runId);
  const moved = () => {
    const previous = runId;
    runId = String(model.get("run_id") || "");
    if (previous === runId) return;
    remove(models, previous, model);
    if (runId) add(models, runId, model);
    notify(previous);
    notify(runId);
  };
  model.on("change:run_id", moved);
  return () => {
    model.off("change:run_id", moved);
    remove(models, runId, model);
    notify(runId);
  };
}

/**
 * The newest model of this page that follows `runId`, or null.
 * @param {string} runId
 * @returns {WidgetModel | null}
 */
export function findModel(runId) {
  const models = registry().models.get(runId);
  if (models === undefined) return null;
  let newest = null;
  for (const model of models) newest = model;
  return newest;
}

/**
 * Call `callback` whenever the models following `runId` change; returns the unsubscribe.
 * @param {string} runId
 * @param {() => void} callback
 * @returns {() => void}
 */
export function watchModels(runId, callback) {
  const { watchers } = registry();
  add(watchers, runId, callback);
  return () => remove(watchers, runId, callback);
}
