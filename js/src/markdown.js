// Markdown for the text that agents write: parsed by marked, sanitised by DOMPurify.

import DOMPurify from "dompurify";
import { Marked } from "marked";

/** Texts longer than this are shown as plain preformatted text: parsing them on every change would freeze the page. */
export const MAX_MARKDOWN_CHARS = 256 * 1024;

const parser = new Marked({ gfm: true, breaks: false, async: false });

// What model output may never bring into the page: styles and classes that
// restyle JupyterLab around it, forms, and anything that is not HTML.
const PURIFY_CONFIG = {
  USE_PROFILES: { html: true },
  FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "option"],
  FORBID_ATTR: ["style", "class", "id", "target"],
  ALLOW_DATA_ATTR: false,
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
