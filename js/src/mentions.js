// Files as context: `@path` in a reply box or New run's prompt names a file of
// the server, and the files named go into the run's input as `files`.
//
// Typing `@` at the start of a word offers the server's files (Jupyter's
// contents API, paths relative to the server's root): first those of the
// notebook's directory, then the root's; `@dir/` goes into a directory. The
// keyboard chooses (ArrowUp/Down, Enter or Tab takes, Escape closes), a click
// too. On send, the mentions that name existing files become `files`, in the
// order of mention, each once; the text keeps them.

import { apiFetch, withSlash } from "./api.js";
import { element } from "./dom.js";

/**
 * @typedef {import("./api.js").Fetch} Fetch
 * @typedef {{name: string, path: string, type: string}} Entry a file or directory of a listing
 * @typedef {{start: number, end: number, query: string}} Mention the `@` word at the caret: where it is, what follows the `@` up to the caret
 */

/** Entries shown at most. */
export const SHOWN = 20;
/** Ends of a word that are punctuation of the sentence, not of the path ("see @a.csv."). */
const TRAILING = /[.,;:!?)\]}'"]+$/;

/**
 * The `@` word the caret is in, or null: the word starts with `@` and the caret is past it.
 * @param {string} text
 * @param {number} caret
 * @returns {Mention | null}
 */
export function mentionAt(text, caret) {
  let start = caret;
  while (start > 0 && !/\s/.test(text[start - 1])) start -= 1;
  if (text[start] !== "@" || caret === start) return null;
  const query = text.slice(start + 1, caret);
  if (query.includes("@")) return null;
  let end = caret;
  while (end < text.length && !/\s/.test(text[end])) end += 1;
  return { start, end, query };
}

/**
 * A query cut into the directory it names (with its final "/", or "") and the start of a name.
 * @param {string} query
 * @returns {{dir: string, prefix: string}}
 */
export function splitQuery(query) {
  const cut = query.lastIndexOf("/") + 1;
  return { dir: query.slice(0, cut), prefix: query.slice(cut) };
}

/**
 * The directory of a notebook's path ("" for the root, or for none).
 * @param {string | null | undefined} notebook
 * @returns {string}
 */
export function notebookDir(notebook) {
  if (typeof notebook !== "string") return "";
  const cut = notebook.lastIndexOf("/");
  return cut < 0 ? "" : notebook.slice(0, cut);
}

/**
 * `path` under `dir` (both relative to the server's root), without a leading or doubled "/".
 * @param {string} dir
 * @param {string} path
 * @returns {string}
 */
export function joinPath(dir, path) {
  return [dir, path].filter(Boolean).join("/").replace(/\/{2,}/g, "/").replace(/^\//, "");
}

/**
 * The directories a query lists, as the server's root names them: under the notebook's directory first, then the root's.
 * @param {string} query
 * @param {string} home the notebook's directory ("" when none)
 * @returns {string[]}
 */
export function listedDirs(query, home) {
  const { dir } = splitQuery(query);
  const bare = dir.replace(/\/$/, "");
  const dirs = [joinPath(home, bare), bare];
  return dirs.filter((path, i) => dirs.indexOf(path) === i);
}

/**
 * The entries whose name starts with `prefix` (whatever its case), each once, at most `limit`.
 * @param {Entry[]} entries
 * @param {string} prefix
 * @param {number} [limit]
 * @returns {Entry[]}
 */
export function matching(entries, prefix, limit = SHOWN) {
  const wanted = prefix.toLowerCase();
  /** @type {Entry[]} */
  const found = [];
  for (const entry of entries) {
    if (found.length >= limit) break;
    if (!entry.name.toLowerCase().startsWith(wanted) || found.some((known) => known.path === entry.path)) continue;
    found.push(entry);
  }
  return found;
}

/**
 * The entries of a contents API directory model, sorted by name (its malformed ones left out).
 * @param {any} model
 * @returns {Entry[]}
 */
export function entriesOf(model) {
  const content = model && model.type === "directory" && Array.isArray(model.content) ? model.content : [];
  return content
    .filter((/** @type {any} */ item) => typeof item?.name === "string" && typeof item?.path === "string" && item.name)
    .map((/** @type {any} */ item) => ({ name: item.name, path: item.path.replace(/^\//, ""), type: String(item.type || "file") }))
    .sort((/** @type {Entry} */ a, /** @type {Entry} */ b) => a.name.localeCompare(b.name, undefined, { sensitivity: "base" }));
}

/**
 * What a taken entry is written as: `@path`, a directory's with its "/" (to go on into it).
 * @param {Entry} entry
 * @returns {string}
 */
export function written(entry) {
  return `@${entry.path}${entry.type === "directory" ? "/" : ""}`;
}

/**
 * The text with `entry` in place of the mention, and where the caret goes: after a file a space, after a directory nothing (its files are offered next).
 * @param {string} text
 * @param {Mention} mention
 * @param {Entry} entry
 * @returns {{text: string, caret: number}}
 */
export function take(text, mention, entry) {
  const after = text.slice(mention.end);
  const put = written(entry);
  if (entry.type === "directory") return { text: `${text.slice(0, mention.start)}${put}${after}`, caret: mention.start + put.length };
  // After a file, the caret goes past one space: the one already there, else a new one.
  const spaced = /^\s/.test(after) ? put : `${put} `;
  return { text: `${text.slice(0, mention.start)}${spaced}${after}`, caret: mention.start + put.length + 1 };
}

/**
 * The paths the text's `@` words might name, in order, each once: the word as written, and without a sentence's punctuation after it.
 * @param {string} text
 * @returns {string[][]} per mention, its readings, the likelier first
 */
export function mentionedPaths(text) {
  /** @type {string[][]} */
  const mentions = [];
  for (const match of text.matchAll(/(?:^|\s)@(\S+)/g)) {
    const word = match[1];
    const readings = [word, word.replace(TRAILING, "")].filter((path, i, all) => path && !path.endsWith("/") && all.indexOf(path) === i);
    if (readings.length > 0 && !mentions.some((known) => known[0] === readings[0])) mentions.push(readings);
  }
  return mentions;
}

/**
 * The files the text names: each mention's first reading that is a file (under the notebook's directory, else the root), in order, each once.
 * @param {string} text
 * @param {string} home the notebook's directory ("" when none)
 * @param {(path: string) => Promise<boolean>} isFile
 * @returns {Promise<string[]>}
 */
export async function filesOf(text, home, isFile) {
  /** @type {string[]} */
  const files = [];
  for (const readings of mentionedPaths(text)) {
    for (const reading of readings) {
      let found = null;
      for (const path of [joinPath(home, reading), reading].filter((path, i, all) => all.indexOf(path) === i)) {
        if (await isFile(path)) {
          found = path;
          break;
        }
      }
      if (found !== null) {
        if (!files.includes(found)) files.push(found);
        break;
      }
    }
  }
  return files;
}

/**
 * Whether the agent (an entry of `GET agents`) takes `files` in its input: its schema says so.
 * @param {any} agent
 * @returns {boolean}
 */
export function takesFiles(agent) {
  const files = agent?.input_schema?.properties?.files;
  return Boolean(files) && typeof files === "object";
}

/**
 * The contents API URL of a path relative to the server's root.
 * @param {string} baseUrl
 * @param {string} path
 * @returns {string}
 */
export function contentsUrl(baseUrl, path) {
  const encoded = path.split("/").filter(Boolean).map(encodeURIComponent).join("/");
  return `${withSlash(baseUrl)}api/contents${encoded ? `/${encoded}` : ""}`;
}

/** How long a directory's listing is used before it is asked again (ms): a word typed letter by letter asks once. */
export const LISTING_MS = 10_000;

/** The server's files as the contents API says them. */
export class ServerFiles {
  /** @param {{baseUrl: () => string, fetch?: Fetch}} options */
  constructor(options) {
    this.baseUrl = options.baseUrl;
    this.fetch = options.fetch || apiFetch;
    /** @type {Map<string, {at: number, entries: Promise<Entry[]>}>} */
    this.listings = new Map();
    /** The type of each path seen: a file taken from the list is known without asking again. */
    /** @type {Map<string, string>} */
    this.types = new Map();
  }

  /**
   * The entries of the directory `dir` (none where it is not one, or the server cannot say).
   * @param {string} dir
   * @returns {Promise<Entry[]>}
   */
  list(dir) {
    const now = performance.now();
    let listing = this.listings.get(dir);
    if (listing === undefined || now - listing.at > LISTING_MS) {
      listing = { at: now, entries: this._list(dir) };
      this.listings.set(dir, listing);
    }
    return listing.entries;
  }

  /**
   * Whether `path` is a file (a notebook too) of the server.
   * @param {string} path
   * @returns {Promise<boolean>}
   */
  async isFile(path) {
    let type = this.types.get(path);
    if (type === undefined) {
      try {
        const response = await this.fetch(`${contentsUrl(this.baseUrl(), path)}?content=0`);
        type = response.ok ? String((await response.json())?.type || "") : "";
      } catch {
        type = "";
      }
      if (type) this.types.set(path, type);
    }
    return type !== "" && type !== "directory";
  }

  /** @param {string} dir */
  async _list(dir) {
    try {
      const response = await this.fetch(`${contentsUrl(this.baseUrl(), dir)}?content=1`);
      if (!response.ok) return [];
      const entries = entriesOf(await response.json());
      for (const entry of entries) this.types.set(entry.path, entry.type);
      return entries;
    } catch {
      return [];
    }
  }
}

let lists = 0;

/**
 * The completion list under a text box: shown while the caret is in an `@` word.
 * The box's own keydown handler asks `keydown(event)` first: true means the list took the key.
 */
export class FileCompletion {
  /**
   * @param {HTMLTextAreaElement} text
   * @param {{files: ServerFiles, home: () => string}} options `home`: the notebook's directory ("" when none)
   */
  constructor(text, options) {
    this.text = text;
    this.files = options.files;
    this.home = options.home;
    this.id = `agentruns-mentions-${++lists}`;
    /** @type {Mention | null} */
    this.mention = null;
    /** @type {Entry[]} */
    this.shown = [];
    this.active = 0;
    this.generation = 0;
    this.node = element("div", "agentruns-mentions");
    this.node.id = this.id;
    this.node.setAttribute("role", "listbox");
    this.node.setAttribute("aria-label", "Files");
    this.node.hidden = true;
    text.setAttribute("aria-autocomplete", "list");
    text.setAttribute("aria-controls", this.id);
    text.addEventListener("input", () => void this.update());
    text.addEventListener("blur", () => this.close());
    text.addEventListener("click", () => {
      if (this.isOpen) void this.update();
    });
    // A press keeps the focus in the box: the click that follows takes the option.
    this.node.addEventListener("mousedown", (event) => event.preventDefault());
    this.node.addEventListener("click", (event) => {
      const option = /** @type {HTMLElement | null} */ (/** @type {HTMLElement} */ (event.target).closest("[role=option]"));
      if (option !== null) this.choose(Number(option.dataset.index));
    });
  }

  get isOpen() {
    return !this.node.hidden;
  }

  /** Look at the word at the caret: offer what it could name, or close. */
  async update() {
    const generation = ++this.generation;
    const mention = mentionAt(this.text.value, this.text.selectionStart ?? this.text.value.length);
    if (mention === null) return this.close();
    const { prefix } = splitQuery(mention.query);
    const listings = await Promise.all(listedDirs(mention.query, this.home()).map((dir) => this.files.list(dir)));
    if (generation !== this.generation) return;
    const shown = matching(listings.flat(), prefix);
    this.mention = mention;
    if (shown.length === 0) return this.close();
    this.shown = shown;
    this.active = 0;
    this._draw();
  }

  /**
   * The list's keys while it is open; true when it took the key (the box must not send or move).
   * @param {KeyboardEvent} event
   * @returns {boolean}
   */
  keydown(event) {
    if (!this.isOpen || event.isComposing) return false;
    if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      const step = event.key === "ArrowDown" ? 1 : -1;
      this.active = (this.active + step + this.shown.length) % this.shown.length;
      this._draw();
    } else if ((event.key === "Enter" || event.key === "Tab") && !event.shiftKey) {
      this.choose(this.active);
    } else if (event.key === "Escape") {
      this.close();
    } else {
      return false;
    }
    event.preventDefault();
    return true;
  }

  /**
   * Take the `index`th entry shown: its `@path` replaces the word; a directory's files are offered next.
   * @param {number} index
   */
  choose(index) {
    const entry = this.shown[index];
    const mention = this.mention;
    if (entry === undefined || mention === null) return;
    const taken = take(this.text.value, mention, entry);
    this.text.value = taken.text;
    this.text.setSelectionRange(taken.caret, taken.caret);
    this.text.focus();
    this.close();
    // The box redraws (its Send button) as on typing; a directory's word offers its files.
    this.text.dispatchEvent(new Event("input", { bubbles: true }));
  }

  close() {
    this.generation += 1;
    this.mention = null;
    this.shown = [];
    if (this.node.hidden) return;
    this.node.hidden = true;
    this.node.replaceChildren();
    this.text.removeAttribute("aria-activedescendant");
  }

  _draw() {
    this.node.replaceChildren(
      ...this.shown.map((entry, index) => {
        const option = element("div", "agentruns-mention", written(entry).slice(1));
        option.id = `${this.id}-${index}`;
        option.dataset.index = String(index);
        option.dataset.type = entry.type;
        option.setAttribute("role", "option");
        option.setAttribute("aria-selected", String(index === this.active));
        return option;
      }),
    );
    this.node.hidden = false;
    const active = this.node.children[this.active];
    this.text.setAttribute("aria-activedescendant", active.id);
    active.scrollIntoView?.({ block: "nearest" });
  }

  /**
   * The files the text names, for the input.
   * @param {string} text
   * @returns {Promise<string[]>}
   */
  filesOf(text) {
    return filesOf(text, this.home(), (path) => this.files.isFile(path));
  }
}
