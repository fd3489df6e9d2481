// The labextension's renderer: live from the server, in sync with the kernel's model, keeping the record.
import assert from "node:assert/strict";
import { afterEach, beforeEach, test } from "node:test";

import { installPage, sleep, until } from "./dom.mjs";

const page = installPage();
globalThis.DragEvent = class DragEvent extends page.MouseEvent {}; // lumino needs it; jsdom has none
const { RANK, RunRenderer, default: extension, rendererFactory } = await import("../src/renderer.js");
const { MIME_TYPE } = await import("../src/record.js");
const { registerModel } = await import("../src/models.js");
const { markShared } = await import("../src/shared.js");

const RUN = "run_rend";
const WIDGET = "application/vnd.jupyter.widget-view+json";

function runObject(fields = {}) {
  return {
    run_id: RUN, agent: "demo", status: "succeeded", session: "n.ipynb", metadata: { cell_id: "c1" }, input: { prompt: "hi" },
    retry_of: null, created_at: "2026-03-01T10:00:00Z", started_at: "2026-03-01T10:00:00Z", finished_at: "2026-03-01T10:00:09Z",
    last_seq: 30, first_seq: 1,
    snapshot: { messages: [{ id: "m1", role: "assistant", text: "Hello", done: true }], tools: [], progress: null, usage: null },
    output: { text: "Hello" }, error: null, cancel: null, ...fields,
  };
}

/** The server: runs as JSON, records as Markdown when asked for them. */
function fakeServer(runs, { records = true } = {}) {
  const requests = [];
  globalThis.fetch = async (url, init = {}) => {
    const headers = init.headers || {};
    const method = init.method || "GET";
    requests.push({ url, method, accept: headers.Accept, body: init.body ? JSON.parse(init.body) : null, headers });
    const path = new URL(url, "http://x").pathname;
    if (method === "POST" && path === "/api/agentruns/runs") {
      const created = runObject({ run_id: "run_again", status: "queued", last_seq: 0, retry_of: RUN, finished_at: null });
      runs[created.run_id] = created;
      return Response.json(created, { status: 201 });
    }
    if (path === "/api/agentruns/runs") {
      const session = new URL(url, "http://x").searchParams.get("session");
      const listed = Object.values(runs).filter((run) => run.session === session);
      listed.sort((a, b) => b.created_at.localeCompare(a.created_at));
      return Response.json({ runs: listed, next: null });
    }
    const run = runs[decodeURIComponent(path.split("/").pop())];
    if (!run) return Response.json({ error: "run_not_found", message: "no such run" }, { status: 404 });
    if (headers.Accept === "text/markdown" && records) {
      // As the server's: a thread's first run's record goes on with its follow-ups.
      const thread = Object.values(runs)
        .filter((other) => other.metadata && other.metadata.follow_up_of === run.run_id)
        .map((other) => `\n\n> ${other.input.prompt}\n\n${other.status}: ${other.snapshot.messages.map((m) => m.text).join("")}`);
      return new Response(`**${run.agent}** ${run.status} (${run.run_id})\n\n${run.snapshot.messages.map((m) => m.text).join("")}${thread.join("")}`, {
        headers: { "Content-Type": "text/markdown; charset=UTF-8" },
      });
    }
    return Response.json(run);
  };
  return requests;
}

/** An output's mime model as OutputArea drives it: setData renders the same renderer again. */
function outputModel(data, renderer) {
  const model = {
    data,
    trusted: false,
    metadata: {},
    setDataCalls: 0,
    setData({ data: next }) {
      model.setDataCalls += 1;
      model.data = next;
      void renderer.renderModel(model);
    },
  };
  return model;
}

function savedData(fields = {}) {
  return {
    [MIME_TYPE]: { run_id: RUN, status: "running", last_seq: 4, agent: "demo" },
    "text/markdown": "**demo** running",
    "text/plain": "Run(run_id='run_rend', status='running')",
    [WIDGET]: { model_id: "abc", version_major: 2, version_minor: 1 },
    ...fields,
  };
}

function fakeWidgetModel(traits) {
  const handlers = new Map();
  const model = {
    traits: { ...traits },
    saved: [],
    get: (name) => model.traits[name],
    set: (name, value) => {
      model.traits[name] = value;
      for (const handler of handlers.get(`change:${name}`) || []) handler();
    },
    save_changes: () => model.saved.push({ ...model.traits }),
    on: (name, handler) => handlers.set(name, [...(handlers.get(name) || []), handler]),
    off: (name, handler) => handlers.set(name, (handlers.get(name) || []).filter((h) => h !== handler)),
  };
  return model;
}

let renderer;
let cleanups;

beforeEach(() => {
  delete globalThis.__jupyterAgentrunsHub;
  delete globalThis.__jupyterAgentrunsModels;
  delete globalThis.__jupyterAgentrunsThreads;
  cleanups = [];
  renderer = new RunRenderer();
  document.body.replaceChildren(renderer.node);
});

afterEach(() => {
  renderer.dispose();
  for (const cleanup of cleanups) cleanup();
});

test("the renderer outranks the ipywidgets view, and is safe for untrusted notebooks", () => {
  assert.deepEqual(rendererFactory.mimeTypes, [MIME_TYPE]);
  assert.equal(rendererFactory.safe, true);
  assert.ok(RANK < -10, "ipywidgets registers its widget view at -10");
  assert.equal(extension.rank, RANK);
  assert.equal(extension.rendererFactory, rendererFactory);
});

test("a run output renders live from the server, with no kernel at all", async () => {
  fakeServer({ [RUN]: runObject({ status: "running", finished_at: null }) });
  const model = outputModel(savedData(), renderer);
  await renderer.renderModel(model);
  await until(() => renderer.node.querySelector(".agentruns-markdown")?.textContent.trim() === "Hello");
  const root = renderer.node.querySelector(".agentruns-run");
  assert.equal(root.dataset.runId, RUN);
  assert.equal(root.dataset.status, "running");
  assert.equal(renderer.node.querySelector(".agentruns-markdown").textContent.trim(), "Hello");
});

test("a finished run brings a stale saved record up to date, once, without a render loop", async () => {
  const requests = fakeServer({ [RUN]: runObject() });
  const model = outputModel(savedData(), renderer);
  await renderer.renderModel(model);
  await until(() => model.setDataCalls > 0 && renderer.node.querySelector(".agentruns-run").dataset.status === "succeeded");
  assert.equal(model.setDataCalls, 1);
  assert.deepEqual(model.data[MIME_TYPE], { run_id: RUN, status: "succeeded", last_seq: 30, agent: "demo" });
  assert.equal(model.data["text/markdown"], `**demo** succeeded (${RUN})\n\nHello`);
  assert.equal(model.data["text/plain"], "Run(run_id='run_rend', status='succeeded')");
  assert.deepEqual(model.data[WIDGET], savedData()[WIDGET], "the widget view stays for front ends without the extension");
  assert.equal(requests.filter((r) => r.accept === "text/markdown").length, 1);
  await sleep(60); // no second update within this time: no render loop
  assert.equal(model.setDataCalls, 1);
});

test("an up-to-date output is never touched, so the notebook stays clean", async () => {
  const requests = fakeServer({ [RUN]: runObject() });
  const data = savedData({
    [MIME_TYPE]: { run_id: RUN, status: "succeeded", last_seq: 30, agent: "demo" },
    "text/markdown": `**demo** succeeded (${RUN})\n\nHello`,
    "text/plain": "Run(run_id='run_rend', status='succeeded')",
  });
  const model = outputModel(data, renderer);
  await renderer.renderModel(model);
  await until(() => requests.some((r) => r.accept === "text/markdown"), { what: "the record to be read" });
  await sleep(60); // and no update within this time
  assert.equal(model.setDataCalls, 0);
});

test("a server that answers no Markdown record leaves the saved one", async () => {
  fakeServer({ [RUN]: runObject() }, { records: false });
  const model = outputModel(savedData(), renderer);
  await renderer.renderModel(model);
  await until(() => model.setDataCalls > 0);
  assert.equal(model.setDataCalls, 1, "the state still moves on");
  assert.equal(model.data["text/markdown"], "**demo** running");
});

test("a run the server does not have shows the saved record with a note, not an error alone", async () => {
  fakeServer({});
  const model = outputModel(savedData({ "text/markdown": "**demo** succeeded\n\n## Saved answer" }), renderer);
  await renderer.renderModel(model);
  await until(() => renderer.node.querySelector(".agentruns-record h2"));
  assert.equal(renderer.node.querySelector(".agentruns-record h2").textContent, "Saved answer");
  assert.match(renderer.node.querySelector(".agentruns-notice").textContent, /record saved in the notebook/);
  // The saved record holds the thread: no box to continue what the server no longer has.
  assert.equal(renderer.node.querySelector(".agentruns-thread").hidden, true);
  assert.equal(model.setDataCalls, 0);
});

test("the kernel's widget model hears the run's progress through the renderer", async () => {
  fakeServer({ [RUN]: runObject() });
  const widgetModel = fakeWidgetModel({ run_id: RUN, last_seq: 4, status: "running", base_url: "/" });
  cleanups.push(registerModel(widgetModel));
  const model = outputModel(savedData(), renderer);
  await renderer.renderModel(model);
  await until(() => widgetModel.traits.status === "succeeded");
  assert.equal(widgetModel.traits.status, "succeeded");
  assert.equal(widgetModel.traits.last_seq, 30);
});

test("Run again moves the kernel's model and the saved output to the new run", async () => {
  const requests = fakeServer({ [RUN]: runObject() });
  const widgetModel = fakeWidgetModel({ run_id: RUN, last_seq: 30, status: "succeeded", base_url: "/" });
  cleanups.push(registerModel(widgetModel));
  const model = outputModel(savedData(), renderer);
  await renderer.renderModel(model);
  await until(() => renderer.node.querySelector(".agentruns-again")?.hidden === false);
  renderer.node.querySelector(".agentruns-again").click();
  await until(() => renderer.node.querySelector(".agentruns-run")?.dataset.runId === "run_again" && model.data[MIME_TYPE].run_id === "run_again");
  const post = requests.find((r) => r.method === "POST");
  assert.equal(post.body.retry_of, RUN);
  assert.ok(post.headers["Idempotency-Key"]);
  assert.equal(widgetModel.traits.run_id, "run_again");
  assert.equal(model.data[MIME_TYPE].run_id, "run_again");
  assert.equal(model.data["text/markdown"], "**demo** queued (run_again)\n\nHello");
  assert.equal(renderer.node.querySelector(".agentruns-run").dataset.runId, "run_again");
});

test("a follow-up that ended brings the thread into the saved record, and a refresh adds nothing", async () => {
  const followUp = runObject({
    run_id: "run_f1", created_at: "2026-03-01T10:01:00Z", metadata: { follow_up_of: RUN }, input: { prompt: "and then?" },
    snapshot: { messages: [{ id: "m1", role: "assistant", text: "Then this.", done: true }], tools: [], progress: null, usage: null },
  });
  const requests = fakeServer({ [RUN]: runObject(), run_f1: followUp });
  const model = outputModel(savedData(), renderer);
  await renderer.renderModel(model);
  const whole = `**demo** succeeded (${RUN})\n\nHello\n\n> and then?\n\nsucceeded: Then this.`;
  await until(() => model.data["text/markdown"] === whole, { what: "the record with its thread" });
  await until(() => renderer.node.querySelector(".agentruns-thread-run .agentruns-run")?.dataset.status === "succeeded");
  await sleep(60);
  const records = requests.filter((r) => r.accept === "text/markdown").length;
  assert.ok(records <= 2, "once for the run, once more when its thread showed the ended follow-up");

  // The page refreshed: a new renderer of the saved output finds it up to date.
  const saved = model.data;
  renderer.dispose();
  renderer = new RunRenderer();
  document.body.replaceChildren(renderer.node);
  const reopened = outputModel(saved, renderer);
  await renderer.renderModel(reopened);
  await until(() => renderer.node.querySelector(".agentruns-thread-run .agentruns-run")?.dataset.status === "succeeded");
  await until(() => renderer.recordChecked === `${RUN} run_f1`, { what: "the thread's record to be checked" });
  await sleep(60);
  assert.equal(reopened.setDataCalls, 0);
  assert.equal(reopened.data["text/markdown"].split("and then?").length, 2);
});

test("in a shared notebook with its kernel alive, a follow-up goes to the kernel and no page changes the output", async () => {
  const followUp = runObject({
    run_id: "run_f1", created_at: "2026-03-01T10:01:00Z", metadata: { follow_up_of: RUN }, input: { prompt: "and then?" },
    snapshot: { messages: [{ id: "m1", role: "assistant", text: "Then this.", done: true }], tools: [], progress: null, usage: null },
  });
  fakeServer({ [RUN]: runObject(), run_f1: followUp });
  const widgetModel = fakeWidgetModel({ run_id: RUN, last_seq: 4, status: "running", base_url: "/", thread: [] });
  cleanups.push(registerModel(widgetModel));
  const panel = document.createElement("div");
  panel.append(renderer.node);
  document.body.replaceChildren(panel);
  // This page is the one a page-side change would be left to: the kernel still makes it.
  const user = { user: { name: "Ada" } };
  markShared(panel, { clientID: 3, getStates: () => new Map([[3, user], [8, user]]) });
  const model = outputModel(savedData(), renderer);
  await renderer.renderModel(model);
  await until(() => widgetModel.traits.thread?.join(" ") === "run_f1", { what: "the kernel to hear the follow-up" });
  await sleep(60);
  assert.equal(model.setDataCalls, 0, "the kernel's display update is the one change");
  assert.equal(widgetModel.traits.status, "succeeded");
});
