// %%agent cells show their prompt as Markdown; other code cells keep their notebook's language.
import assert from "node:assert/strict";
import { test } from "node:test";

const { PROMPT_MIMETYPE, isAgentCell, cellMimetype, watchAgentCells } = await import("../src/agentcells.js");

function signal() {
  const handlers = [];
  return { connect: (fn) => handlers.push(fn), emit: (...args) => handlers.forEach((fn) => fn(...args)) };
}

/** A cell model with the parts the watcher uses: its source, language and their signals. */
function cellModel(source, type = "code") {
  const cell = {
    type,
    source,
    language: "text/x-ipython",
    contentChanged: signal(),
    mimeTypeChanged: signal(),
    sharedModel: { getSource: () => cell.source },
    get mimeType() {
      return cell.language;
    },
    set mimeType(value) {
      if (value === cell.language) return;
      cell.language = value;
      cell.mimeTypeChanged.emit(cell, { newValue: value });
    },
    edit(text) {
      cell.source = text;
      cell.contentChanged.emit(cell);
    },
  };
  return cell;
}

function cellList(models) {
  return { length: models.length, get: (index) => models[index], changed: signal() };
}

test("an agent cell is %%agent on its first line, alone or with arguments", () => {
  for (const source of ["%%agent", "%%agent demo\nwhat is in df?", "%%agent\r\nhi", "%%agent\topencode"]) {
    assert.equal(isAgentCell(source), true, source);
  }
  for (const source of ["%%agents", "%agent demo", " %%agent demo", "x = 1\n%%agent", ""]) {
    assert.equal(isAgentCell(source), false, source);
  }
  assert.equal(cellMimetype("%%agent demo\nhi", "text/x-ipython"), PROMPT_MIMETYPE);
  assert.equal(cellMimetype("print(1)", "text/x-ipython"), "text/x-ipython");
});

test("agent cells get Markdown as their language, back to the notebook's once the magic goes", async () => {
  const notebook = { codeMimetype: "text/x-ipython" };
  const agent = cellModel("%%agent demo\nwhat is in df?");
  const code = cellModel("df.head()");
  const markdown = cellModel("%%agent in a markdown cell", "markdown");
  markdown.language = "text/x-ipythongfm";
  const cells = cellList([agent, code, markdown]);
  await watchAgentCells(notebook, cells);
  assert.equal(agent.mimeType, PROMPT_MIMETYPE);
  assert.equal(code.mimeType, "text/x-ipython");

  // The kernel changes: the notebook sets every code cell's language, and agent cells go back to Markdown.
  notebook.codeMimetype = "text/x-python";
  for (const cell of [agent, code]) cell.mimeType = notebook.codeMimetype;
  await new Promise((resolve) => setTimeout(resolve, 0)); // once its language has loaded
  assert.equal(agent.mimeType, PROMPT_MIMETYPE);
  assert.equal(code.mimeType, "text/x-python");

  // Typing the magic into a code cell, and taking it away.
  code.edit("%%agent demo\nexplain");
  assert.equal(code.mimeType, PROMPT_MIMETYPE);
  code.edit("explain()");
  assert.equal(code.mimeType, "text/x-python");

  // A cell added later is watched too.
  const added = cellModel("%%agent demo\nnew");
  cells.changed.emit(cells, { type: "add", newValues: [added] });
  assert.equal(added.mimeType, PROMPT_MIMETYPE);
});
