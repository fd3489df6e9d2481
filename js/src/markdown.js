// Markdown for the text that agents write: parsed by marked, sanitised by DOMPurify.

import DOMPurify from "dompurify";
import { Marked } from "marked";

/** Texts longer than this are shown as plain preformatted text: parsing them on every change would freeze the page. */
export const MAX_MARKDOWN_CHARS = 256 * 1024;

// Model text is text: HTML in it is shown as written, never parsed, and an
// image is a link to it (the reader's browser fetching a URL a model wrote
// is how a prompt-injected model sends data out).
const parser = new Marked({
  gfm: true,
  breaks: false,
  async: false,
  renderer: {
    /** @param {import("marked").Tokens.HTML | import("marked").Tokens.Tag} token */
    html({ text, block }) {
      const shown = escapeHtml(text);
      return block ? `<p>${shown}</p>\n` : shown;
    },
    /**
     * @this {import("marked").Renderer}
     * @param {import("marked").Tokens.Image} token
     */
    image({ href, title, text, raw, tokens }) {
      /** @type {import("marked").Token[]} */
      const label = tokens && tokens.length ? tokens : [{ type: "text", raw: text || href, text: text || href }];
      return this.link({ type: "link", raw, href, title, text: text || href, tokens: label });
    },
    // A task list's box as a character: no form element (a plan's checklist keeps its ticks).
    /** @param {import("marked").Tokens.Checkbox} token */
    checkbox({ checked }) {
      return checked ? "☑ " : "☐ ";
    },
  },
});

/** @param {string} text */
function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (char) => `&#${char.charCodeAt(0)};`);
}

// Only what Markdown itself makes, with attributes that load nothing: no
// element that fetches (img, video, iframe, svg, link...), no styles or
// classes that restyle JupyterLab around it, no forms.
export const PURIFY_CONFIG = {
  ALLOWED_TAGS: [
    "a", "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "em", "strong", "del", "code", "pre", "blockquote",
    "ul", "ol", "li", "table", "thead", "tbody", "tr", "th", "td",
  ],
  ALLOWED_ATTR: ["href", "title", "align", "start"],
  ALLOW_DATA_ATTR: false,
  ALLOW_ARIA_ATTR: false,
};

/**
 * @typedef {ReturnType<typeof DOMPurify>} Purifier
 */

/**
 * A DOMPurify for `window` (the page's, or a test's DOM) that makes every
 * link open in a new tab without handing it this page.
 * @param {any} [window]
 * @returns {Purifier}
 */
export function createSanitizer(window) {
  const purifier = window === undefined ? DOMPurify : DOMPurify(window);
  purifier.addHook("afterSanitizeAttributes", (node) => {
    if (node.nodeName === "A" && node.hasAttribute("href")) {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer");
    }
  });
  return purifier;
}

/** @type {Purifier | null} */
let pageSanitizer = null;

/** @returns {Purifier} */
function sanitizer() {
  if (pageSanitizer === null) pageSanitizer = createSanitizer();
  return pageSanitizer;
}

/**
 * Markdown as sanitised HTML.
 * @param {string} text
 * @param {Purifier} [purifier]
 * @returns {string}
 */
export function markdownToHtml(text, purifier = sanitizer()) {
  const html = /** @type {string} */ (parser.parse(text));
  return purifier.sanitize(html, PURIFY_CONFIG);
}

/**
 * Show `text` in `target`: as sanitised Markdown, or as plain text when it is too long for that.
 * @param {HTMLElement} target
 * @param {string} text
 * @param {Purifier} [purifier]
 */
export function renderMarkdown(target, text, purifier = sanitizer()) {
  if (text.length > MAX_MARKDOWN_CHARS) {
    const pre = target.ownerDocument.createElement("pre");
    pre.className = "agentruns-plain";
    pre.textContent = text;
    target.replaceChildren(pre);
    return;
  }
  const fragment = purifier.sanitize(parser.parse(text, { async: false }), { ...PURIFY_CONFIG, RETURN_DOM_FRAGMENT: true });
  target.replaceChildren(fragment);
}
