// Conversations as a chat: the list (newest first, paged, a click opens one) and a conversation's view
// (its agent's runs oldest first, Earlier, one reply box that follows up the first run).
import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";
import { installPage, until } from "./dom.mjs";

installPage();
const { ConversationList, ConversationView, CONVERSATIONS_PAGE, CONVERSATION_PAGE, runCount, sessionName } = await import("../src/conversations.js");
const { RunActions } = await import("../src/actions.js");
const { FOLLOW_UP_OF } = await import("../src/thread.js");

const NOW = Date.parse("2026-12-06T12:00:00.000Z");
const SESSION = "/home/me/work/a.ipynb";

function fakeServer(routes) {
  const server = { requests: [] };
  server.fetch = async (url, init = {}) => {
    const parsed = new URL(url, "http://localhost");
    const body = typeof init.body === "string" ? JSON.parse(init.body) : init.body;
    const request = { url, path: parsed.pathname, query: parsed.searchParams, method: init.method || "GET", headers: init.headers || {}, body };
    server.requests.push(request);
    return routes(request);
  };
  return server;
}

const conversation = (n, fields = {}) => ({
  session: `/home/me/work/n${n}.ipynb`, agent: "demo", title: `question ${n}`, runs: n, last_run_id: `run_${n}`,
  updated_at: new Date(NOW - n * 60_000).toISOString(), ...fields,
});

beforeEach(() => installPage());

test("words of a row", () => {
  assert.equal(runCount(1), "1 run");
  assert.equal(runCount(3), "3 runs");
  assert.equal(sessionName("/home/me/work/a.ipynb"), "a.ipynb");
});

test("the list shows the conversations newest first, pages on with More, and a click opens one", async () => {
  const server = fakeServer(({ query }) =>
    query.get("before") === null
      ? Response.json({ conversations: [conversation(1), conversation(2)], next: "cur1" })
      : Response.json({ conversations: [conversation(2), conversation(3, { agent: "opencode" })], next: null }),
  );
  const opened = [];
  const list = new ConversationList({ baseUrl: "/base", fetch: server.fetch, open: (c) => opened.push(c), now: () => NOW });
  await list.load();
  assert.equal(server.requests[0].path, "/base/api/agentruns/conversations");
  assert.equal(server.requests[0].query.get("limit"), String(CONVERSATIONS_PAGE));
  let rows = [...list.list.querySelectorAll(".agentruns-conversation")];
  assert.deepEqual(rows.map((row) => row.querySelector(".agentruns-conversation-title").textContent), ["question 1", "question 2"]);
  assert.equal(rows[1].querySelector(".agentruns-conversation-line").textContent, "demon2.ipynb2 runs2 min ago");
  assert.equal(list.moreButton.hidden, false);
  list.moreButton.click();
  await until(() => list.list.children.length === 3, { what: "the second page below the first, n2 once" });
  assert.equal(server.requests[1].query.get("before"), "cur1");
  assert.equal(list.moreButton.hidden, true);
  rows = [...list.list.querySelectorAll(".agentruns-conversation")];
  assert.equal(rows[2].dataset.agent, "opencode");
  rows[2].click();
  assert.deepEqual(opened.map((c) => [c.session, c.agent]), [["/home/me/work/n3.ipynb", "opencode"]]);
});

test("the list says when it could not read, and has nothing to open then", async () => {
  const server = fakeServer(() => Response.json({ error: "forbidden", message: "not yours" }, { status: 403 }));
  const list = new ConversationList({ baseUrl: "/", fetch: server.fetch, open: () => assert.fail("nothing to open") });
  await list.load();
  assert.match(list.message.textContent, /Could not list the conversations: not yours/);
  assert.equal(list.list.children.length, 0);
});

const run = (id, minute, fields = {}) => ({
  run_id: id, agent: "demo", status: "succeeded", session: SESSION, created_at: `2026-12-06T10:${String(minute).padStart(2, "0")}:00.000Z`,
  metadata: { notebook: "work/a.ipynb", kernel_id: "k1" }, input: { prompt: id }, ...fields,
});

/** A session's runs, newest first, paged by run id like the server. */
function sessionServer(runs, posted = []) {
  return fakeServer(({ path, query, method, body, headers }) => {
    if (method === "POST" && path === "/api/agentruns/runs") {
      posted.push({ body, key: headers["Idempotency-Key"] });
      const made = run(`run_new${posted.length}`, 59, { status: "queued", metadata: body.metadata, input: body.input });
      runs.unshift(made);
      return Response.json(made, { status: 201 });
    }
    if (method === "GET" && path === "/api/agentruns/runs") {
      let listed = runs.filter((r) => r.session === query.get("session"));
      const before = query.get("before");
      if (before) listed = listed.slice(listed.findIndex((r) => r.run_id === before) + 1);
      const limit = Number(query.get("limit"));
      const page = listed.slice(0, limit);
      return Response.json({ runs: page, next: listed.length > limit ? page[page.length - 1].run_id : null });
    }
    return Response.json({ error: "run_not_found", message: "no such run" }, { status: 404 });
  });
}

function fakeViews() {
  const views = [];
  const makeView = (host, node) => {
    const view = { attached: [], attach: (id) => view.attached.push(id), dispose: () => (view.disposed = true), host, node };
    views.push(view);
    return view;
  };
  return { views, makeView };
}

const noAgents = { offered: async () => ({ mode: [], model: [], current: {} }), forget() {} };

test("the view shows its agent's runs of the session oldest first, Earlier above them", async () => {
  // Newest first, as the server lists: 25 runs of demo, one of another agent among them.
  const runs = [];
  for (let minute = 30; minute >= 5; minute -= 1) runs.push(run(`run_${minute}`, minute, minute === 20 ? { agent: "other" } : {}));
  runs[runs.length - 1].metadata = { notebook: "work/a.ipynb" }; // run_5, the first
  for (const r of runs.slice(0, -1)) r.metadata = { ...r.metadata, [FOLLOW_UP_OF]: "run_5" };
  const server = sessionServer(runs);
  const { views, makeView } = fakeViews();
  const view = new ConversationView({ baseUrl: "/", session: SESSION, agent: "demo", fetch: server.fetch, makeView, agents: noAgents });
  await view.load();
  assert.equal(server.requests[0].query.get("session"), SESSION);
  assert.equal(server.requests[0].query.get("limit"), String(CONVERSATION_PAGE));
  const shown = () => view.entries.map((entry) => entry.runId);
  assert.equal(shown()[0], "run_11");
  assert.equal(shown().at(-1), "run_30");
  assert.ok(!shown().includes("run_20"), "another agent's run is another conversation");
  assert.deepEqual([...view.list.children].map((node) => node.dataset.runId), shown());
  assert.equal(view.earlierButton.hidden, false);
  view.earlierButton.click();
  await until(() => view.entries.length === 25, { what: "the earlier runs" });
  assert.deepEqual(shown().slice(0, 3), ["run_5", "run_6", "run_7"]);
  assert.equal(view.earlierButton.hidden, true);
  assert.equal(view.rootId(), "run_5");
  assert.ok(views.every((v) => v.attached.length === 1));
  assert.equal(view.box.reason, "");
  view.dispose();
  assert.ok(views.every((v) => v.disposed));
});

test("a reply is a run in the same session and agent following up the first run, shown at the bottom at once", async () => {
  const runs = [run("run_2", 2, { metadata: { [FOLLOW_UP_OF]: "run_1", notebook: "work/a.ipynb", kernel_id: "k2" } }), run("run_1", 1)];
  const posted = [];
  const server = sessionServer(runs, posted);
  const { views, makeView } = fakeViews();
  const view = new ConversationView({
    baseUrl: "/", session: SESSION, agent: "demo", fetch: server.fetch, makeView, agents: noAgents,
    actions: new RunActions({ baseUrl: "/", fetch: server.fetch, intents: new Map() }),
  });
  await view.load();
  view.box.text.value = "and now plot it";
  await view.box.submit();
  assert.equal(posted.length, 1);
  assert.deepEqual(posted[0].body, {
    agent: "demo", session: SESSION, input: { prompt: "and now plot it" },
    metadata: { [FOLLOW_UP_OF]: "run_1", notebook: "work/a.ipynb", kernel_id: "k2" },
  });
  assert.deepEqual(view.entries.map((entry) => entry.runId), ["run_1", "run_2", "run_new1"]);
  assert.equal(view.list.lastElementChild.dataset.runId, "run_new1");
  assert.deepEqual(views.at(-1).attached, ["run_new1"]);
  assert.equal(view.box.text.value, "");
  // Its run is going: the box waits, saying why, and a second Enter sends nothing.
  assert.match(view.box.note.textContent, /still on the last message/);
  assert.equal(view.box.text.disabled, true);
  view.box.text.value = "more";
  await view.box.submit();
  assert.equal(posted.length, 1);
  views.at(-1).host.shown({ status: "succeeded" });
  assert.equal(view.box.reason, "");
  assert.equal(view.box.text.disabled, false);
});

test("the box waits while a run of the conversation is active, and says why a send failed", async () => {
  const runs = [run("run_1", 1, { status: "running" })];
  const server = sessionServer(runs);
  const { views, makeView } = fakeViews();
  const down = async () => {
    throw new TypeError("network down");
  };
  const view = new ConversationView({
    baseUrl: "/", session: SESSION, agent: "demo", fetch: server.fetch, makeView, agents: noAgents,
    actions: new RunActions({ baseUrl: "/", fetch: down, intents: new Map() }),
  });
  assert.match(view.box.reason, /Loading/);
  await view.load();
  assert.match(view.box.reason, /still on the last message/);
  views[0].host.shown({ status: "cancelled" });
  assert.equal(view.box.reason, "");
  view.box.text.value = "again";
  await view.box.submit();
  assert.match(view.box.note.textContent, /Not sent: cannot reach the server/);
  assert.equal(view.entries.length, 1);
  assert.equal(view.box.text.value, "again", "the text stays to send again");
});

test("a conversation with no run of its agent has nothing to reply to", async () => {
  const server = sessionServer([run("run_1", 1, { agent: "other" })]);
  const { makeView } = fakeViews();
  const view = new ConversationView({ baseUrl: "/", session: SESSION, agent: "demo", fetch: server.fetch, makeView, agents: noAgents });
  await view.load();
  assert.equal(view.entries.length, 0);
  assert.match(view.box.reason, /no run of its agent/);
});

test("Open beside is there only where something docks the view", () => {
  const server = sessionServer([]);
  const { makeView } = fakeViews();
  let beside = 0;
  const docked = new ConversationView({ baseUrl: "/", session: SESSION, agent: "demo", fetch: server.fetch, makeView, agents: noAgents, openBeside: () => (beside += 1) });
  docked.besideButton.click();
  assert.equal(beside, 1);
  const plain = new ConversationView({ baseUrl: "/", session: SESSION, agent: "demo", fetch: server.fetch, makeView, agents: noAgents });
  assert.equal(plain.besideButton, null);
});

test("reading the list again keeps the pages More added", async () => {
  const all = Array.from({ length: CONVERSATIONS_PAGE + 5 }, (_, i) => conversation(i + 1));
  const server = fakeServer(({ query }) => {
    const start = query.get("before") === null ? 0 : Number(query.get("before"));
    const page = all.slice(start, start + Number(query.get("limit")));
    return Response.json({ conversations: page, next: start + page.length < all.length ? String(start + page.length) : null });
  });
  const list = new ConversationList({ baseUrl: "/", fetch: server.fetch, open: () => {}, now: () => NOW });
  await list.load();
  assert.equal(list.conversations.length, CONVERSATIONS_PAGE);
  await list.more();
  assert.equal(list.conversations.length, CONVERSATIONS_PAGE + 5);
  await list.load();
  assert.equal(server.requests.at(-1).query.get("limit"), String(CONVERSATIONS_PAGE + 5));
  assert.equal(list.list.children.length, CONVERSATIONS_PAGE + 5);
  assert.equal(list.moreButton.hidden, true);
});

test("Run again in the chat: the new run takes the old one's place", async () => {
  const server = sessionServer([run("run_1", 1, { status: "failed" })]);
  const { views, makeView } = fakeViews();
  const view = new ConversationView({ baseUrl: "/", session: SESSION, agent: "demo", fetch: server.fetch, makeView, agents: noAgents });
  await view.load();
  views[0].host.ranAgain(run("run_1b", 3, { status: "queued" }), "run_1");
  assert.deepEqual(view.entries.map((entry) => entry.runId), ["run_1b"]);
  assert.deepEqual(views[0].attached, ["run_1", "run_1b"]);
  assert.match(view.box.reason, /still on the last message/);
});

test("runs of the conversation started elsewhere show at the bottom at the next look", async () => {
  const runs = [run("run_1", 1)];
  const server = sessionServer(runs);
  const { makeView } = fakeViews();
  const view = new ConversationView({ baseUrl: "/", session: SESSION, agent: "demo", fetch: server.fetch, makeView, agents: noAgents });
  await view.refresh();
  assert.equal(server.requests.length, 0, "nothing before it is loaded");
  await view.load();
  runs.unshift(run("run_3", 3, { status: "running" }), run("run_other", 2, { agent: "other" }));
  runs.unshift(run("run_4", 4, { status: "queued" }));
  await view.refresh();
  assert.deepEqual(view.entries.map((entry) => entry.runId), ["run_1", "run_3", "run_4"]);
  assert.match(view.box.reason, /still on the last message/);
  await view.refresh();
  assert.equal(view.entries.length, 3);
});

test("a reply's @ names a file of the newest run's notebook's directory: the run gets it in files", async () => {
  const runs = [run("run_1", 1)];
  const posted = [];
  const session = sessionServer(runs, posted);
  const server = fakeServer((request) => {
    if (request.path === "/api/contents/work/a.csv") return Response.json({ name: "a.csv", path: "work/a.csv", type: "file", content: null });
    if (request.path.startsWith("/api/contents")) return Response.json({ message: "No such file" }, { status: 404 });
    return session.fetch(request.url, { method: request.method, body: request.body, headers: request.headers });
  });
  const takesFiles = { ...noAgents, agent: async (name) => ({ name, input_schema: { properties: { prompt: {}, files: {} } } }) };
  const view = new ConversationView({
    baseUrl: "/", session: SESSION, agent: "opencode", fetch: server.fetch, makeView: fakeViews().makeView, agents: takesFiles,
    actions: new RunActions({ baseUrl: "/", fetch: server.fetch, intents: new Map() }),
  });
  runs[0].agent = "opencode";
  await view.load();
  view.box.text.value = "plot @a.csv and @nothing.csv";
  await view.box.submit();
  assert.deepEqual(posted[0].body.input, { prompt: "plot @a.csv and @nothing.csv", files: ["work/a.csv"] });
});
