// Ask about this cell: the prompt a cell makes (source, outputs as text, bounded), and the form that sends it.
import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";
import { installPage, until } from "./dom.mjs";

installPage();
const { AskCellForm, CELL_CONTEXT_CHARS, askBody, cellLabel, cellPrompt, clipMiddle, outputText, stripAnsi } = await import("../src/askcell.js");
const { RunActions } = await import("../src/actions.js");

beforeEach(() => installPage());

const TRACEBACK = [
  "\u001b[0;31m---------------------------------------------------------------------------\u001b[0m",
  "\u001b[0;31mKeyError\u001b[0m                                  Traceback (most recent call last)",
  "Cell \u001b[0;32mIn[4], line 1\u001b[0m\n\u001b[0;32m----> 1\u001b[0m df[\u001b[38;5;124m'price'\u001b[39m]",
];

const CELL = {
  cell_type: "code",
  execution_count: 4,
  source: ["import pandas as pd\n", "df['price'].mean()"],
  outputs: [
    { output_type: "stream", name: "stdout", text: ["loading 10%\rloading 100%\n", "done\n"] },
    { output_type: "execute_result", execution_count: 4, data: { "text/plain": "42.5", "text/html": "<b>42.5</b>" }, metadata: {} },
    { output_type: "display_data", data: { "image/png": "iVBORw0KGgo=", "text/plain": "<Figure size 640x480 with 1 Axes>" }, metadata: {} },
    { output_type: "error", ename: "KeyError", evalue: "'price'", traceback: TRACEBACK },
  ],
};

test("an output's text: a stream as last shown, a result's text/plain, an image named, an error without colours", () => {
  assert.equal(outputText(CELL.outputs[0]), "loading 100%\ndone\n");
  assert.equal(outputText(CELL.outputs[1]), "42.5");
  assert.equal(outputText(CELL.outputs[2]), "<Figure size 640x480 with 1 Axes>\n[an image (image/png), not included]");
  const error = outputText(CELL.outputs[3]);
  assert.doesNotMatch(error, /\u001b/);
  assert.match(error, /^KeyError: 'price'\n-+\nKeyError {10,}Traceback/);
  assert.match(error, /----> 1 df\['price'\]/);
  assert.equal(outputText({ output_type: "display_data", data: { "text/html": "<table/>" } }), "[an output (text/html), not included]");
  assert.equal(stripAnsi("\u001b]8;;http://x\u0007link\u001b]8;;\u0007 \u001b[1mbold\u001b[0m"), "link bold");
});

test("the prompt is the question, then the cell's source and its outputs, fenced", () => {
  const prompt = cellPrompt("Why does this fail?", { cell: CELL, index: 2, notebook: "work/prices.ipynb", language: "python" });
  assert.equal(
    prompt,
    [
      "Why does this fail?",
      "",
      "This is about cell 3, In [4] of the notebook work/prices.ipynb. Its source:",
      "",
      "```python",
      "import pandas as pd",
      "df['price'].mean()",
      "```",
      "",
      "Its output:",
      "",
      "```",
      "loading 100%",
      "done",
      "",
      "42.5",
      "<Figure size 640x480 with 1 Axes>",
      "[an image (image/png), not included]",
      outputText(CELL.outputs[3]),
      "```",
    ].join("\n"),
  );
});

test("a source with backticks gets a longer fence; a markdown cell has no output part; a cell not run says so", () => {
  const prompt = cellPrompt("what?", { cell: { cell_type: "code", source: "s = '```'", outputs: [] }, index: 0, notebook: "a.ipynb" });
  assert.match(prompt, /\n````\ns = '```'\n````\n\nIt has no output\.$/);
  const markdown = cellPrompt("what?", { cell: { cell_type: "markdown", source: "# Title" }, index: 1, notebook: "a.ipynb" });
  assert.match(markdown, /markdown cell 2 of the notebook a\.ipynb/);
  assert.match(markdown, /```markdown\n# Title\n```$/);
});

test("a long cell is cut in its middle to the bound, saying how much was cut", () => {
  const source = `first line\n${"x = 1\n".repeat(3000)}last line`;
  const output = `${"row\n".repeat(10_000)}Error at the end`;
  const cell = { cell_type: "code", source, outputs: [{ output_type: "stream", name: "stdout", text: output }] };
  const prompt = cellPrompt("why?", { cell, index: 0, notebook: "a.ipynb" });
  const context = prompt.length - cellPrompt("why?", { cell: { cell_type: "code", source: "", outputs: [{ output_type: "stream", text: "." }] }, index: 0, notebook: "a.ipynb" }).length;
  assert.ok(context <= CELL_CONTEXT_CHARS, `${context} characters of context`);
  assert.ok(context > CELL_CONTEXT_CHARS - 200, `${context} characters of context: the bound is used`);
  for (const kept of ["first line", "last line", "Error at the end"]) assert.ok(prompt.includes(kept), kept);
  assert.match(prompt, /\[… [\d,]+ characters of the source cut here …\]/);
  assert.match(prompt, /\[… [\d,]+ characters of the output cut here …\]/);
  // A short source keeps all of itself; the output takes the rest.
  const short = cellPrompt("why?", { cell: { ...cell, source: "print(rows)" }, index: 0, notebook: "a.ipynb" });
  assert.match(short, /```\nprint\(rows\)\n```/);
  assert.ok(short.length > CELL_CONTEXT_CHARS - 200);
});

test("clipping counts the characters cut and keeps an emoji whole", () => {
  const clipped = clipMiddle("a".repeat(100) + "😀".repeat(100) + "b".repeat(100), 150, "output");
  assert.ok(clipped.length <= 150);
  assert.doesNotMatch(clipped, /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/);
  const cut = Number(clipped.match(/\[… ([\d,]+) characters/)[1].replace(/,/g, ""));
  assert.equal(clipped.length - clipped.match(/\n\[…[^\]]*\]\n/)[0].length + cut, 400);
  assert.equal(clipMiddle("short", 150, "output"), "short");
});

test("the label names the cell's place, count and first line", () => {
  assert.equal(cellLabel(CELL, 2), "Cell 3 [4]: import pandas as pd");
  assert.equal(cellLabel({ cell_type: "code", source: "\n\n  plot()  \n", execution_count: null }, 0), "Cell 1: plot()");
  assert.equal(cellLabel({ cell_type: "code", source: "" }, 0), "Cell 1: (empty)");
});

test("the body goes to the notebook's conversation with its kernel; a question is needed", () => {
  const asked = { cell: CELL, index: 0, notebook: "work/prices.ipynb", kernelId: "k-1" };
  const { body } = askBody({ agent: "demo", question: "why?", asked, chosen: { mode: "plan" } });
  assert.equal(body.session, "work/prices.ipynb");
  assert.deepEqual(body.metadata, { notebook: "work/prices.ipynb", kernel_id: "k-1" });
  assert.equal(body.input.mode, "plan");
  assert.match(body.input.prompt, /^why\?\n/);
  assert.match(askBody({ agent: "demo", question: "  ", asked }).problem, /Write your question/);
});

test("the form shows the cell, sends one run for a double Enter, then opens the conversation", async () => {
  let reply;
  const requests = [];
  const answers = [Response.json({ agents: [{ name: "demo" }], default_agent: "demo" }), new Promise((resolve) => (reply = resolve))];
  const fetch = async (url, init = {}) => {
    requests.push({ url, method: init.method || "GET", headers: init.headers || {}, body: init.body });
    return answers.shift();
  };
  const opened = [];
  let closed = 0;
  const form = new AskCellForm({
    baseUrl: "/",
    fetch,
    actions: new RunActions({ baseUrl: "/", fetch, intents: new Map() }),
    asked: { cell: CELL, index: 2, notebook: "work/prices.ipynb", kernelId: null },
    openConversation: (session, agent, runId) => opened.push([session, agent, runId]),
    closed: () => (closed += 1),
  });
  document.body.append(form.node);
  await form.open();
  assert.equal(form.node.querySelector(".agentruns-askcell-cell").textContent, "Cell 3 [4]: import pandas as pd");
  assert.equal(form.notebook.closest("label").hidden, true);
  assert.equal(document.activeElement, form.prompt);
  const enter = () => form.prompt.dispatchEvent(new window.KeyboardEvent("keydown", { key: "Enter", bubbles: true }));
  enter(); // an empty question sends nothing
  assert.match(form.message.textContent, /Write your question/);
  form.prompt.value = "Why is there a KeyError?";
  enter();
  enter();
  await until(() => requests.length === 2);
  reply(Response.json({ run_id: "r1", agent: "demo", session: "work/prices.ipynb", status: "queued" }, { status: 201 }));
  await until(() => opened.length === 1);
  assert.equal(requests.filter((request) => request.method === "POST").length, 1);
  const body = requests[1].body;
  assert.equal(body.session, "work/prices.ipynb");
  assert.match(body.input.prompt, /^Why is there a KeyError\?\n[\s\S]*df\['price'\]\.mean\(\)[\s\S]*KeyError: 'price'/);
  assert.deepEqual(opened, [["work/prices.ipynb", "demo", "r1"]]);
  assert.equal(closed, 1);
});

test("Escape closes the form without a run", async () => {
  const fetch = async () => Response.json({ agents: [{ name: "demo" }] });
  let closed = 0;
  const form = new AskCellForm({
    baseUrl: "/", fetch, asked: { cell: CELL, index: 0, notebook: "a.ipynb" }, openConversation: () => assert.fail("nothing opens"), closed: () => (closed += 1),
  });
  await form.open();
  form.prompt.dispatchEvent(new window.KeyboardEvent("keydown", { key: "Escape", bubbles: true }));
  assert.equal(closed, 1);
});
