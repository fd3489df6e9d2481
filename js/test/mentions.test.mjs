// Files as context: the `@` word at the caret, what it offers, what taking one writes, and the files a text names.
import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";
import { installPage, until } from "./dom.mjs";

installPage();
const {
  FileCompletion, SHOWN, ServerFiles, contentsUrl, entriesOf, filesOf, listedDirs, matching, mentionAt, mentionedPaths,
  splitQuery, take, takesFiles,
} = await import("../src/mentions.js");
const { FollowUpBox, runHome } = await import("../src/thread.js");
const { choiceWords } = await import("../src/pickers.js");
const { NewRunForm, newRunBody } = await import("../src/newrun.js");
const { RunActions } = await import("../src/actions.js");

beforeEach(() => installPage());

/** A contents API with these directories (path → entries) and nothing else. */
function contentsServer(tree) {
  const server = { requests: [] };
  server.fetch = async (url) => {
    server.requests.push(url);
    const path = decodeURIComponent(new URL(url, "http://localhost").pathname.replace(/^\/api\/contents\/?/, ""));
    if (path in tree) {
      const content = tree[path].map(([name, type]) => ({ name, type, path: path ? `${path}/${name}` : name }));
      return Response.json({ name: path, path, type: "directory", content: url.includes("content=0") ? null : content });
    }
    const parent = path.includes("/") ? path.slice(0, path.lastIndexOf("/")) : "";
    const found = (tree[parent] || []).find(([name]) => (parent ? `${parent}/${name}` : name) === path);
    if (found) return Response.json({ name: found[0], path, type: found[1], content: null });
    return Response.json({ message: "No such file or directory" }, { status: 404 });
  };
  return server;
}

const TREE = {
  "": [["data.csv", "file"], ["Data", "directory"], ["notes.md", "file"], ["work", "directory"]],
  work: [["analysis.ipynb", "notebook"], ["daily.parquet", "file"]],
  Data: [["raw.json", "file"]],
};

test("the word at the caret is a mention only where it starts with @", () => {
  assert.deepEqual(mentionAt("look at @da", 11), { start: 8, end: 11, query: "da" });
  assert.deepEqual(mentionAt("@work/an and more", 8), { start: 0, end: 8, query: "work/an" });
  assert.deepEqual(mentionAt("@work/an", 3), { start: 0, end: 8, query: "wo" }, "the caret inside the word: the word is replaced whole");
  assert.deepEqual(mentionAt("see @", 5), { start: 4, end: 5, query: "" });
  assert.equal(mentionAt("mail me@example.org", 19), null, "an address is not a mention");
  assert.equal(mentionAt("@da then", 8), null, "the caret past the word");
  assert.equal(mentionAt("@da", 0), null, "the caret before the @");
  assert.deepEqual(splitQuery("work/sub/an"), { dir: "work/sub/", prefix: "an" });
  assert.deepEqual(splitQuery("da"), { dir: "", prefix: "da" });
});

test("a word lists the notebook's directory first, then the root's, and matches names by their start whatever the case", () => {
  assert.deepEqual(listedDirs("da", "work"), ["work", ""]);
  assert.deepEqual(listedDirs("sub/x", "work"), ["work/sub", "sub"]);
  assert.deepEqual(listedDirs("da", ""), [""]);
  const root = entriesOf({ type: "directory", content: TREE[""].map(([name, type]) => ({ name, type, path: name })) });
  const work = entriesOf({ type: "directory", content: TREE.work.map(([name, type]) => ({ name, type, path: `work/${name}` })) });
  assert.deepEqual(matching([...work, ...root], "DA").map((entry) => entry.path), ["work/daily.parquet", "Data", "data.csv"]);
  const many = Array.from({ length: 50 }, (_, i) => ({ name: `d${i}`, path: `d${i}`, type: "file" }));
  assert.equal(matching(many, "d").length, SHOWN);
  assert.deepEqual(entriesOf({ type: "file", content: "x" }), []);
  assert.equal(contentsUrl("/user/a b/", "my dir/x#1.csv"), "/user/a b/api/contents/my%20dir/x%231.csv");
  assert.equal(contentsUrl("/", ""), "/api/contents");
});

test("taking a file writes @path and a space, a directory @dir/ to go on into it", () => {
  const text = "compare @da with the rest";
  const mention = mentionAt(text, 11);
  assert.deepEqual(take(text, mention, { name: "data.csv", path: "data.csv", type: "file" }), { text: "compare @data.csv with the rest", caret: 18 });
  assert.deepEqual(take("read @da", mentionAt("read @da", 8), { name: "data.csv", path: "data.csv", type: "file" }), { text: "read @data.csv ", caret: 15 });
  assert.deepEqual(take("@wo", mentionAt("@wo", 3), { name: "work", path: "work", type: "directory" }), { text: "@work/", caret: 6 });
});

test("the files a text names: the ones that exist, in the order of mention, each once", async () => {
  assert.deepEqual(mentionedPaths("see @a.csv, then @b.py. and @a.csv again; me@x.org @dir/"), [["a.csv,", "a.csv"], ["b.py.", "b.py"], ["a.csv"]]);
  const server = contentsServer(TREE);
  const files = new ServerFiles({ baseUrl: () => "/", fetch: server.fetch });
  const text = "plot @work/daily.parquet against @data.csv. and @missing.txt, @Data and @analysis.ipynb then @data.csv";
  assert.deepEqual(await filesOf(text, "work", (path) => files.isFile(path)), ["work/daily.parquet", "data.csv", "work/analysis.ipynb"]);
  const asked = server.requests.length;
  assert.deepEqual(await filesOf("@data.csv", "", (path) => files.isFile(path)), ["data.csv"]);
  assert.equal(server.requests.length, asked, "a path found once is not asked again");
});

test("only an agent whose input schema has files is sent them; the view says the files a run used", () => {
  assert.equal(takesFiles({ name: "opencode", input_schema: { properties: { prompt: {}, files: { type: "array" } } } }), true);
  assert.equal(takesFiles({ name: "demo", input_schema: { properties: { prompt: {} }, additionalProperties: false } }), false);
  assert.equal(takesFiles(undefined), false);
  assert.equal(choiceWords({ prompt: "x", mode: "plan", files: ["data.csv"] }), "mode plan · file data.csv");
  assert.equal(choiceWords({ prompt: "x", files: ["a.csv", "work/b.py"] }), "files a.csv, work/b.py");
  assert.deepEqual(newRunBody({ agent: "opencode", prompt: "@a.csv", notebook: "", files: ["a.csv"] }).body, {
    agent: "opencode", input: { prompt: "@a.csv", files: ["a.csv"] },
  });
  assert.equal(runHome({ session: "work/a.ipynb", metadata: {} }), "work");
  assert.equal(runHome({ session: "review", metadata: { notebook: "w/b.ipynb" } }), "w");
  assert.equal(runHome({ session: "review", metadata: {} }), "");
});

/** Type into the box as a person does: the text, the caret at its end, an input event. */
function type(box, text) {
  box.text.value += text;
  box.text.setSelectionRange(box.text.value.length, box.text.value.length);
  box.text.dispatchEvent(new window.Event("input", { bubbles: true }));
}

function press(box, key, init = {}) {
  const event = new window.KeyboardEvent("keydown", { key, cancelable: true, ...init });
  box.text.dispatchEvent(event);
  return event;
}

function replyBox(attaches = true) {
  const server = contentsServer(TREE);
  const sent = [];
  const box = new FollowUpBox(
    async (text, chosen) => {
      sent.push({ text, chosen });
      return null;
    },
    { files: new ServerFiles({ baseUrl: () => "/", fetch: server.fetch }), home: () => "work", attaches: async () => attaches },
  );
  document.body.append(box.node);
  return { box, sent, server };
}

test("the keyboard chooses a file: arrows move, Enter takes it and does not send, then Enter sends with the files", async () => {
  const { box, sent } = replyBox();
  const list = box.completion.node;
  type(box, "compare @DA");
  await until(() => !list.hidden);
  assert.equal(list.getAttribute("role"), "listbox");
  const options = () => [...list.querySelectorAll("[role=option]")];
  assert.deepEqual(options().map((option) => option.textContent), ["work/daily.parquet", "Data/", "data.csv"]);
  assert.equal(box.text.getAttribute("aria-activedescendant"), options()[0].id);
  assert.equal(box.text.getAttribute("aria-controls"), list.id);
  press(box, "ArrowDown");
  press(box, "ArrowDown");
  assert.equal(options()[2].getAttribute("aria-selected"), "true");
  assert.equal(box.text.getAttribute("aria-activedescendant"), options()[2].id);
  press(box, "ArrowDown");
  assert.equal(options()[0].getAttribute("aria-selected"), "true", "past the last, the first");
  press(box, "ArrowUp");
  const enter = press(box, "Enter");
  assert.equal(enter.defaultPrevented, true);
  assert.equal(box.text.value, "compare @data.csv ");
  assert.equal(list.hidden, true);
  assert.equal(box.text.hasAttribute("aria-activedescendant"), false);
  assert.deepEqual(sent, [], "Enter took the file: nothing was sent");
  type(box, "with @work/daily.parquet");
  await until(() => !list.hidden);
  press(box, "Escape");
  assert.equal(list.hidden, true);
  press(box, "Enter");
  await until(() => sent.length === 1);
  assert.deepEqual(sent[0], { text: "compare @data.csv with @work/daily.parquet", chosen: { files: ["data.csv", "work/daily.parquet"] } });
});

test("Tab takes a directory and offers its files; a click takes one; an agent without files gets none", async () => {
  const { box, sent } = replyBox(false);
  const list = box.completion.node;
  type(box, "@Dat");
  await until(() => !list.hidden);
  assert.equal(press(box, "Tab").defaultPrevented, true);
  assert.equal(box.text.value, "@Data/");
  await until(() => !list.hidden && list.textContent === "Data/raw.json");
  list.querySelector("[role=option]").dispatchEvent(new window.MouseEvent("click", { bubbles: true }));
  assert.equal(box.text.value, "@Data/raw.json ");
  type(box, "please");
  await until(() => list.hidden);
  press(box, "Enter");
  await until(() => sent.length === 1);
  assert.deepEqual(sent[0], { text: "@Data/raw.json please", chosen: {} }, "the text keeps the mention; no files for this agent");
});

test("a word that matches nothing shows no list, and Enter sends", async () => {
  const { box, sent, server } = replyBox();
  type(box, "@zz");
  await until(() => server.requests.length >= 2);
  assert.equal(box.completion.node.hidden, true);
  press(box, "Enter");
  await until(() => sent.length === 1);
  assert.deepEqual(sent[0].chosen, {});
});

test("a completion of a box with no notebook lists the root", async () => {
  const server = contentsServer(TREE);
  const text = document.createElement("textarea");
  document.body.append(text);
  const completion = new FileCompletion(text, { files: new ServerFiles({ baseUrl: () => "/", fetch: server.fetch }), home: () => "" });
  text.value = "@n";
  text.setSelectionRange(2, 2);
  text.dispatchEvent(new window.Event("input"));
  await until(() => !completion.node.hidden);
  assert.equal(completion.node.textContent, "notes.md");
  assert.deepEqual(server.requests, ["/api/contents?content=1"]);
});

test("New run's prompt offers the notebook's directory first; Escape closes the list, not the form; the run gets the files", async () => {
  const contents = contentsServer(TREE);
  const posts = [];
  const agents = {
    agents: [{ name: "demo", input_schema: { properties: { prompt: {} } } }, { name: "opencode", input_schema: { properties: { prompt: {}, files: {} } } }],
    default_agent: "opencode",
  };
  const fetch = async (url, init = {}) => {
    if (url.endsWith("api/agentruns/agents")) return Response.json(agents);
    if (init.method === "POST") {
      posts.push(init.body);
      return Response.json({ run_id: "run_new", status: "queued" }, { status: 201 });
    }
    return contents.fetch(url);
  };
  const opened = [];
  const form = new NewRunForm({ baseUrl: "/", fetch, actions: new RunActions({ baseUrl: "/", fetch, intents: new Map() }), openRun: (id) => opened.push(id) });
  document.body.append(form.node);
  await form.open();
  form.notebook.value = "work/a.ipynb";
  const prompt = { text: form.prompt };
  type(prompt, "summarise @da");
  await until(() => !form.completion.node.hidden);
  assert.deepEqual([...form.completion.node.children].map((option) => option.textContent), ["work/daily.parquet", "Data/", "data.csv"]);
  press(prompt, "Escape");
  assert.equal(form.completion.node.hidden, true);
  assert.equal(form.node.hidden, false, "Escape closed the list only");
  type(prompt, "i");
  await until(() => !form.completion.node.hidden && form.completion.node.children.length === 1);
  press(prompt, "Enter");
  assert.equal(form.prompt.value, "summarise @work/daily.parquet ");
  assert.equal(posts.length, 0, "Enter took the file: nothing started");
  press(prompt, "Enter");
  await until(() => opened.length === 1);
  assert.deepEqual(posts[0], {
    agent: "opencode", input: { prompt: "summarise @work/daily.parquet ", files: ["work/daily.parquet"] },
    session: "work/a.ipynb", metadata: { notebook: "work/a.ipynb" },
  });
});
