// Notebooks that are shared documents (jupyter-collaboration): every page that
// holds one writes to the same outputs. A change of an output made by each page
// at once (the record of a run brought up to date) would be made once per page:
// the Y array keeps each page's copy. So one page of those holding the document
// writes it: the one whose client id is the lowest of the pages the document's
// awareness knows (each page's own state says who its person is). The
// labextension marks the panels here; the run renderer asks before it changes
// an output. On globalThis: the renderer's and the plugins' copies of this
// module see the same marks.

const KEY = "__jupyterAgentrunsSharedNotebooks";

/**
 * @typedef {{clientID: number, getStates: () => Map<number, Record<string, any>>}} Awareness
 *   what a shared document's awareness (y-protocols) tells of the pages holding it
 */

/** @returns {WeakMap<Element, Awareness | null>} */
function marked() {
  const page = /** @type {Record<string, any>} */ (globalThis);
  if (!(page[KEY] instanceof WeakMap)) page[KEY] = new WeakMap();
  return page[KEY];
}

/**
 * The panel `node` holds a shared document, whose awareness is `awareness` (if known).
 * @param {Element} node
 * @param {Awareness | null} [awareness]
 */
export function markShared(node, awareness = null) {
  marked().set(node, awareness);
}

/**
 * The panel marked shared that holds `node`: its awareness (null if unknown), or undefined.
 * @param {Element | null} node
 * @returns {Awareness | null | undefined}
 */
function sharedPanel(node) {
  const nodes = marked();
  for (let element = node; element !== null; element = element.parentElement) {
    if (nodes.has(element)) return nodes.get(element);
  }
  return undefined;
}

/**
 * Whether `node` is inside a notebook that is a shared document.
 * @param {Element | null} node
 * @returns {boolean}
 */
export function inSharedNotebook(node) {
  return sharedPanel(node) !== undefined;
}

/**
 * Whether this page is the one to change the outputs of `node`'s notebook: always where
 * the notebook is not shared; in a shared one, the page of the lowest client id among the
 * pages holding it (a state with a `user`: the server's own copy has none). A page that
 * does not know the others yet, or its awareness, leaves it to them. Where the output's
 * kernel is alive (`kernelWrites`), no page: the kernel updates its display, the page that
 * ran the cell writes that to the document, and a change made by another page at the same
 * time would be kept beside it, a second copy of the output.
 * @param {Element | null} node
 * @param {boolean} [kernelWrites]
 * @returns {boolean}
 */
export function writesOutputs(node, kernelWrites = false) {
  const awareness = sharedPanel(node);
  if (awareness === undefined) return true;
  if (awareness === null || kernelWrites) return false;
  const pages = [...awareness.getStates()].filter(([, state]) => state && state.user).map(([id]) => id);
  return pages.includes(awareness.clientID) && Math.min(...pages) === awareness.clientID;
}
