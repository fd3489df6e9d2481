// %%agent cells: what follows the magic's line is a prompt, not Python. Their
// editor shows it as Markdown, so words such as
// "is", "for" and "in" are not coloured as keywords and quotes open no strings.
//
// A code cell's language is its notebook's (the kernel's); the notebook sets it
// again when the kernel changes, and each time this sets it back for agent cells.
// Nothing is saved: a cell's language is the editor's, not the notebook's file's.

/** Markdown, as JupyterLab's editors know it, given to agent cells. */
export const PROMPT_MIMETYPE = "text/x-markdown";

/**
 * Whether a cell's source is an agent cell: `%%agent` alone on its first line, or with arguments.
 * @param {string} source
 */
export function isAgentCell(source) {
  return /^%%agent(?:[ \t]|\r?\n|$)/.test(source);
}

/**
 * The language a code cell's editor shows: its notebook's, or Markdown for an agent cell.
 * @param {string} source
 * @param {string} codeMimetype
 */
export function cellMimetype(source, codeMimetype) {
  return isAgentCell(source) ? PROMPT_MIMETYPE : codeMimetype;
}

/**
 * @typedef {{
 *   type: string,
 *   mimeType: string,
 *   sharedModel: {getSource(): string},
 *   contentChanged: {connect(fn: () => void): unknown},
 *   mimeTypeChanged: {connect(fn: () => void): unknown},
 *   isDisposed?: boolean,
 * }} CellModel
 */

/**
 * Keep the language of the agent cells of one notebook.
 *
 * An editor draws the language whose support loads last, not the one set last:
 * `loaded(mimetype)` (the editors' language registry) must have loaded a
 * language before a cell is set to it, and the notebook's own before it is set
 * back, so that the two load in the order they are set.
 * @param {{codeMimetype: string}} notebook the notebook widget (its code cells' language)
 * @param {{length: number, get(index: number): CellModel, changed: {connect(fn: (sender: any, change: {type: string, newValues: CellModel[]}) => void): unknown}}} cells
 * @param {(mimetype: string) => Promise<unknown>} [loaded]
 */
export async function watchAgentCells(notebook, cells, loaded = async () => undefined) {
  await Promise.all([loaded(PROMPT_MIMETYPE), loaded(notebook.codeMimetype)]);
  /** @type {WeakSet<CellModel>} */
  const watched = new WeakSet();
  /** @param {CellModel} cell */
  const apply = (cell) => {
    if (cell.type !== "code" || cell.isDisposed) return;
    const source = cell.sharedModel.getSource();
    const wanted = isAgentCell(source) ? PROMPT_MIMETYPE : cell.mimeType === PROMPT_MIMETYPE ? notebook.codeMimetype : null;
    if (wanted !== null && cell.mimeType !== wanted) cell.mimeType = wanted;
  };
  /** @param {CellModel} cell */
  const watch = (cell) => {
    if (watched.has(cell) || cell.type !== "code") return;
    watched.add(cell);
    cell.contentChanged.connect(() => apply(cell));
    // Once the language set has loaded (the editor asked for it already), and after
    // the change's other listeners: the editor then takes this change last.
    cell.mimeTypeChanged.connect(() => {
      const set = cell.mimeType;
      void loaded(set).then(
        () => apply(cell),
        () => apply(cell),
      );
    });
    apply(cell);
  };
  for (let index = 0; index < cells.length; index += 1) watch(cells.get(index));
  cells.changed.connect((_, change) => {
    if (change.type === "add" || change.type === "set") for (const cell of change.newValues) watch(cell);
  });
}
