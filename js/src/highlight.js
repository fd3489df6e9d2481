// Python code as a person reads it in a cell: keywords, strings, comments,
// numbers and decorators in the theme's editor colours. A small tokenizer,
// not a parser: what it does not know stays plain text, and the text itself
// is never changed (the code a run shows is the code that runs).

const KEYWORDS = new Set(
  (
    "False None True and as assert async await break class continue def del elif else except " +
    "finally for from global if import in is lambda nonlocal not or pass raise return try while " +
    "with yield match case"
  ).split(" "),
);
const BUILTINS = new Set(
  (
    "print len range list dict set tuple str int float bool type isinstance enumerate zip map " +
    "filter sorted sum min max abs open round repr super object any all"
  ).split(" "),
);

// One alternative per kind, tried at each place in this order.
const TOKEN = new RegExp(
  [
    /(#[^\n]*)/.source, // a comment
    /((?:[rRbBuUfF]{1,2})?(?:"""[\s\S]*?(?:"""|$)|'''[\s\S]*?(?:'''|$)|"(?:\\.|[^"\\\n])*(?:"|$)|'(?:\\.|[^'\\\n])*(?:'|$)))/.source, // a string
    /(@[A-Za-z_][\w.]*)/.source, // a decorator
    /\b(\d[\d_]*(?:\.[\d_]*)?(?:[eE][+-]?\d+)?j?|0[xXoObB][\da-fA-F_]+)\b/.source, // a number
    /\b([A-Za-z_]\w*)\b/.source, // a name
  ].join("|"),
  "g",
);

/**
 * The tokens of `code`: [kind, text] pairs whose texts join to `code` again.
 * Kinds: "comment", "string", "decorator", "number", "keyword", "builtin", "" (plain).
 * @param {string} code
 * @returns {Array<[string, string]>}
 */
export function pythonTokens(code) {
  /** @type {Array<[string, string]>} */
  const tokens = [];
  let at = 0;
  for (const match of code.matchAll(TOKEN)) {
    const start = match.index ?? 0;
    if (start > at) tokens.push(["", code.slice(at, start)]);
    const [text, comment, string, decorator, number, name] = match;
    let kind = "";
    if (comment !== undefined) kind = "comment";
    else if (string !== undefined) kind = "string";
    else if (decorator !== undefined) kind = "decorator";
    else if (number !== undefined) kind = "number";
    else if (name !== undefined) kind = KEYWORDS.has(name) ? "keyword" : BUILTINS.has(name) ? "builtin" : "";
    const last = tokens[tokens.length - 1];
    if (kind === "" && last !== undefined && last[0] === "") last[1] += text;
    else tokens.push([kind, text]);
    at = start + text.length;
  }
  if (at < code.length) tokens.push(["", code.slice(at)]);
  return tokens;
}

/**
 * `code` highlighted as Python, into `into` (text nodes and spans only: no HTML is parsed).
 * @param {HTMLElement} into
 * @param {string} code
 */
export function highlightPython(into, code) {
  for (const [kind, text] of pythonTokens(code)) {
    if (kind === "") {
      into.appendChild(document.createTextNode(text));
    } else {
      const span = document.createElement("span");
      span.className = `agentruns-hl-${kind}`;
      span.textContent = text;
      into.appendChild(span);
    }
  }
}
