// Notebooks that are shared documents (jupyter-collaboration): every page that
// holds one writes to the same outputs. A change of an output made by each page
// at once (the record of a run brought up to date) would be made once per page:
// the Y array keeps each page's copy. The labextension marks their panels here;
// the run renderer asks before it changes an output. On globalThis: the
// renderer's and the plugins' copies of this module see the same marks.

const KEY = "__jupyterAgentrunsSharedNotebooks";

/** @returns {WeakSet<Element>} */
function marked() {
  const page = /** @type {Record<string, any>} */ (globalThis);
  if (!(page[KEY] instanceof WeakSet)) page[KEY] = new WeakSet();
  return page[KEY];
}

/**
 * The panel `node` holds a shared document.
 * @param {Element} node
 */
export function markShared(node) {
  marked().add(node);
}

/**
 * Whether `node` is inside a notebook that is a shared document.
 * @param {Element | null} node
 * @returns {boolean}
 */
export function inSharedNotebook(node) {
  const nodes = marked();
  for (let element = node; element !== null; element = element.parentElement) if (nodes.has(element)) return true;
  return false;
}
