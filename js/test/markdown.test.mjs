// Markdown from model output: rendered, and never able to run script or restyle the page.
import assert from "node:assert/strict";
import { test } from "node:test";

import { JSDOM } from "jsdom";

import { MAX_MARKDOWN_CHARS, createSanitizer, markdownToHtml, renderMarkdown } from "../src/markdown.js";

const { window } = new JSDOM("<!doctype html><body></body>");
const purifier = createSanitizer(window);

/** @param {string} text */
function rendered(text) {
  const target = window.document.createElement("div");
  renderMarkdown(target, text, purifier);
  return target;
}

test("headings, lists, tables and code blocks become HTML", () => {
  const html = markdownToHtml("# Weather\n\n- sun\n- rain\n\n| day | °C |\n|---|---|\n| Mon | 21 |\n\n```python\nprint(1)\n```\n", purifier);
  assert.match(html, /<h1>Weather<\/h1>/);
  assert.match(html, /<ul>\s*<li>sun<\/li>\s*<li>rain<\/li>\s*<\/ul>/);
  assert.match(html, /<table>[\s\S]*<td>Mon<\/td>[\s\S]*<\/table>/);
  assert.match(html, /<pre><code>print\(1\)\n<\/code><\/pre>/);
});

test("an image's event handler is dropped", () => {
  const target = rendered('<img src=x onerror="globalThis.pwned = 1">');
  const image = target.querySelector("img");
  assert.ok(image);
  assert.equal(image.getAttribute("onerror"), null);
  assert.equal(target.innerHTML.includes("pwned"), false);
});

test("script elements never come through", () => {
  const target = rendered("hello <script>globalThis.pwned = 1</script>\n\n<script src=//evil.example></script>");
  assert.equal(target.querySelector("script"), null);
  assert.equal(target.innerHTML.includes("pwned"), false);
});

test("javascript: links lose their href, in Markdown and in HTML", () => {
  const target = rendered("[click](javascript:alert(1)) and <a href=\"JaVaScRiPt:alert(2)\">this</a>");
  for (const link of target.querySelectorAll("a")) {
    assert.equal(link.hasAttribute("href"), false, link.outerHTML);
  }
});

test("links open in a new tab without handing it this page", () => {
  const link = rendered("see [the docs](https://jupyter.org/)").querySelector("a");
  assert.ok(link);
  assert.equal(link.getAttribute("href"), "https://jupyter.org/");
  assert.equal(link.getAttribute("target"), "_blank");
  assert.equal(link.getAttribute("rel"), "noopener noreferrer");
});

test("styles, classes, ids and forms cannot restyle or clobber the page", () => {
  const target = rendered(
    '<style>body{display:none}</style><div class="jp-Notebook" id="main" style="position:fixed">x</div><form><input name="q"></form><iframe src="/"></iframe>'
  );
  assert.equal(target.querySelector("style, form, input, iframe"), null);
  const div = target.querySelector("div");
  assert.ok(div);
  assert.deepEqual(div.getAttributeNames(), []);
});

test("a text too long for Markdown is shown as plain preformatted text", () => {
  const text = `# not a heading here\n${"x".repeat(MAX_MARKDOWN_CHARS)}`;
  const target = rendered(text);
  const pre = target.querySelector("pre.agentruns-plain");
  assert.ok(pre);
  assert.equal(pre.textContent, text);
  assert.equal(target.querySelector("h1"), null);
});

test("half-written Markdown, as it streams, still renders", () => {
  const target = rendered("```js\nlet x = 1;\n| a | b");
  assert.ok(target.querySelector("pre code"));
});
