// The agent's modes and models as pickers: what they offer, what they hold first, what goes into the input.
import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";
import { installPage, until } from "./dom.mjs";

installPage();
const { AgentDirectory, ChoicePickers, choiceWords, offeredBy, preferred } = await import("../src/pickers.js");
const { ThreadIndex, ThreadSection } = await import("../src/thread.js");
const { NewRunForm } = await import("../src/newrun.js");
const { RunActions } = await import("../src/actions.js");

const SCRIPTED = {
  name: "scripted",
  modes: [{ id: "ask", name: "Ask", description: "Answers, changes nothing" }, { id: "plan", name: "Plan" }],
  models: [{ id: "small", name: "Small" }, { id: "large", name: "Large" }],
  current: { mode: "ask", model: "small" },
};
const AGENTS = { agents: [{ name: "demo" }, SCRIPTED], default_agent: "scripted" };
const ROOT = {
  run_id: "run_root", agent: "scripted", status: "succeeded", session: "s1", created_at: "2026-12-06T10:00:00.000Z",
  metadata: {}, input: { prompt: "hi", model: "large" },
};

function fakeServer(routes) {
  const server = { requests: [] };
  server.fetch = async (url, init = {}) => {
    server.requests.push({ url, method: init.method || "GET", body: init.body });
    return routes(url, init);
  };
  return server;
}

beforeEach(() => installPage());

test("what an agent offers leaves out malformed entries and a current id it does not list", () => {
  const offered = offeredBy({
    modes: [{ id: "ask", name: "" }, { name: "no id" }, { id: "ask", name: "again" }, "plan"],
    models: "not a list",
    current: { mode: "yolo", model: "small" },
  });
  assert.deepEqual(offered, { mode: [{ id: "ask", name: "ask" }], model: [], current: {} });
  assert.deepEqual(offeredBy(undefined), { mode: [], model: [], current: {} });
  assert.deepEqual(offeredBy(SCRIPTED).current, { mode: "ask", model: "small" });
});

test("a picker holds the conversation's last choice, else the agent's current one", () => {
  const offered = offeredBy(SCRIPTED);
  assert.equal(preferred(offered, "mode", [{ prompt: "a" }]), "ask");
  assert.equal(preferred(offered, "mode", [{ mode: "plan" }, { prompt: "b" }]), "plan");
  assert.equal(preferred(offered, "model", [{ model: "large" }, { model: "gone" }]), "large");
  assert.equal(preferred(offeredBy({}), "mode", []), "");
});

test("a view says the mode and model its run's input chose", () => {
  assert.equal(choiceWords({ prompt: "x", mode: "plan", model: "large" }), "mode plan · model large");
  assert.equal(choiceWords({ prompt: "x" }), "");
  assert.equal(choiceWords(null), "");
});

test("pickers are labelled selects, hidden where the agent offers fewer than two", () => {
  const pickers = new ChoicePickers("here");
  assert.equal(pickers.node.hidden, true);
  assert.deepEqual(pickers.chosen(), {});
  pickers.show(offeredBy({ ...SCRIPTED, models: [{ id: "only", name: "Only" }] }), []);
  assert.equal(pickers.node.hidden, false);
  assert.equal(pickers.labels.model.hidden, true);
  assert.equal(pickers.selects.mode.getAttribute("aria-label"), "The agent's mode");
  assert.equal(pickers.labels.mode.textContent.startsWith("Mode"), true);
  assert.equal(pickers.selects.mode.options[0].title, "Answers, changes nothing");
  pickers.selects.mode.value = "plan";
  assert.deepEqual(pickers.chosen(), { mode: "plan" });
});

test("the directory reads GET agents once for every picker of the page, and again when told", async () => {
  const server = fakeServer(async () => Response.json(AGENTS));
  const directory = new AgentDirectory({ baseUrl: "/base", fetch: server.fetch });
  const [a, b] = await Promise.all([directory.offered("scripted"), directory.offered("demo")]);
  assert.equal(a.mode.length, 2);
  assert.equal(b.mode.length, 0);
  assert.equal(server.requests.length, 1);
  assert.equal(server.requests[0].url, "/base/api/agentruns/agents");
  directory.forget();
  await directory.offered("scripted");
  assert.equal(server.requests.length, 2);
});

test("the reply box offers the agent's modes and models and sends the chosen ones in the input", async () => {
  const server = fakeServer(async (url, init) => {
    if (url.includes("/agents")) return Response.json(AGENTS);
    if (init.method === "POST") return Response.json({ ...ROOT, run_id: "run_new", status: "queued", input: init.body.input }, { status: 201 });
    return Response.json({ runs: [ROOT], next: null });
  });
  const section = new ThreadSection({
    baseUrl: () => "/",
    actions: () => new RunActions({ baseUrl: "/", fetch: server.fetch, intents: new Map() }),
    makeView: () => ({ attach() {}, dispose() {} }),
    agents: new AgentDirectory({ baseUrl: "/", fetch: server.fetch }),
    index: new ThreadIndex({ baseUrl: "/", fetch: server.fetch }),
  });
  section.show(ROOT, "succeeded");
  const pickers = section.box.pickers;
  await until(() => !pickers.node.hidden);
  // The root run chose the large model: the box holds it; the mode is the agent's own.
  assert.deepEqual(pickers.chosen(), { mode: "ask", model: "large" });
  pickers.selects.mode.value = "plan";
  section.box.text.value = "now plan it";
  await section.box.submit();
  const post = server.requests.find((request) => request.method === "POST");
  assert.deepEqual(post.body.input, { prompt: "now plan it", mode: "plan", model: "large" });
  assert.equal(section.box.note.textContent, "The agent is still on the last message: wait for it, or cancel it.");
  assert.equal(pickers.selects.mode.disabled, true, "no choosing while it cannot send");
});

test("New run offers the chosen agent's modes and models and starts the run with them", async () => {
  const server = fakeServer(async (url, init) => {
    if (url.includes("/agents")) return Response.json(AGENTS);
    return Response.json({ run_id: "run_n", status: "queued" }, { status: 201 });
  });
  const actions = new RunActions({ baseUrl: "/", fetch: server.fetch, intents: new Map() });
  const form = new NewRunForm({ baseUrl: "/", fetch: server.fetch, actions });
  await form.open();
  assert.equal(form.agent.value, "scripted");
  assert.equal(form.pickers.node.hidden, false);
  form.pickers.selects.model.value = "large";
  form.prompt.value = "hello";
  await form.start();
  const post = server.requests.find((request) => request.method === "POST");
  assert.deepEqual(post.body.input, { prompt: "hello", mode: "ask", model: "large" });
  form.agent.value = "demo";
  form.agent.dispatchEvent(new window.Event("change"));
  assert.equal(form.pickers.node.hidden, true, "an agent that offers none has no pickers");
});

test("an agent that said nothing before its first run is asked again once that run ends, once", async () => {
  const answers = [{ agents: [{ name: "scripted" }] }, AGENTS, AGENTS];
  const server = fakeServer(async (url) => {
    if (url.includes("/agents")) return Response.json(answers.shift());
    return Response.json({ runs: [], next: null });
  });
  const section = new ThreadSection({
    baseUrl: () => "/",
    actions: () => new RunActions({ baseUrl: "/", fetch: server.fetch, intents: new Map() }),
    makeView: () => ({ attach() {}, dispose() {} }),
    agents: new AgentDirectory({ baseUrl: "/", fetch: server.fetch }),
    index: new ThreadIndex({ baseUrl: "/", fetch: server.fetch }),
  });
  const agentReads = () => server.requests.filter((request) => request.url.includes("/agents")).length;
  section.show({ ...ROOT, status: "running" }, "running");
  await until(() => agentReads() === 1);
  assert.equal(section.box.pickers.node.hidden, true);
  section.show({ ...ROOT, status: "running" }, "succeeded");
  await until(() => !section.box.pickers.node.hidden);
  assert.equal(agentReads(), 2);
  section.show({ ...ROOT, status: "running" }, "running");
  section.show({ ...ROOT, status: "running" }, "succeeded");
  await new Promise((resolve) => setTimeout(resolve, 20));
  assert.equal(agentReads(), 2, "known now: not asked again");
});
