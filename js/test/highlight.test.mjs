import assert from "node:assert/strict";
import { test } from "node:test";

import { highlightPython, pythonTokens } from "../src/highlight.js";
import { installPage } from "./dom.mjs";

installPage();

const kinds = (code) => pythonTokens(code).filter(([kind]) => kind !== "").map(([kind, text]) => `${kind}:${text}`);

test("the tokens join to the code again, whatever it holds", () => {
  for (const code of [
    'import pandas as pd\ndf = pd.read_csv("a.csv")  # load\nprint(df.describe())',
    "x = '''never closed\n",
    'f"{x!r}" + b\'\\x00\' if 1_000.5e-3 else 0xFF',
    "@dataclass\nclass A:\n    async def b(self): await c()",
    "",
    "<script>alert(1)</script>",
  ]) {
    assert.equal(pythonTokens(code).map(([, text]) => text).join(""), code);
  }
});

test("keywords, builtins, strings, comments, numbers and decorators are told apart", () => {
  assert.deepEqual(kinds('import pandas as pd\nprint(len("a # b"))  # count'), [
    "keyword:import",
    "keyword:as",
    "builtin:print",
    "builtin:len",
    'string:"a # b"',
    "comment:# count",
  ]);
  assert.deepEqual(kinds("@cache\ndef f(x=1.5e3):\n    return f'{x}'"), [
    "decorator:@cache",
    "keyword:def",
    "number:1.5e3",
    "keyword:return",
    "string:f'{x}'",
  ]);
  // A name that holds a keyword is no keyword.
  assert.deepEqual(kinds("format_def = imports"), []);
});

test("highlighting makes spans and text only: markup in the code stays text", () => {
  const code = document.createElement("code");
  highlightPython(code, 'print("<b>hi</b>")');
  assert.equal(code.textContent, 'print("<b>hi</b>")');
  assert.equal(code.querySelector("b"), null);
  assert.deepEqual(
    [...code.querySelectorAll("span")].map((span) => span.className),
    ["agentruns-hl-builtin", "agentruns-hl-string"],
  );
});
