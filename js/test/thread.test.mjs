// The thread under a run's view: follow-ups found again from the server, sent once, the box's rules.
import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";
import { installPage, until } from "./dom.mjs";

installPage();
const { DRAFT_SECONDS, FOLLOW_UP_OF, FollowUpBox, ThreadIndex, ThreadSection, followUpBody, threadRoot, whyNot } = await import("../src/thread.js");
const { RunActions } = await import("../src/actions.js");

const ROOT = {
  run_id: "run_root", agent: "opencode", status: "succeeded", session: "work/a.ipynb", created_at: "2026-12-06T10:00:00.000Z",
  metadata: { cell_id: "c1", kernel_id: "k1", notebook: "work/a.ipynb", cell_source: "%%agent opencode\nhi" },
  input: { prompt: "hi" },
};
const run = (id, created, extra = {}) => ({
  run_id: id, agent: "opencode", status: "succeeded", session: "work/a.ipynb", created_at: created, metadata: {}, ...extra,
});

function fakeServer(routes) {
  const server = { requests: [] };
  server.fetch = async (url, init = {}) => {
    server.requests.push({ url, method: init.method || "GET", headers: init.headers || {}, body: init.body });
    const answer = await routes(url, init);
    if (answer === "down") throw new TypeError("network down");
    return answer;
  };
  return server;
}

beforeEach(() => installPage());

test("a follow-up continues the first run's conversation, where it works, not its cell", () => {
  assert.deepEqual(followUpBody(ROOT, "and now plot it"), {
    agent: "opencode", session: "work/a.ipynb", input: { prompt: "and now plot it" },
    metadata: { [FOLLOW_UP_OF]: "run_root", kernel_id: "k1", notebook: "work/a.ipynb" },
  });
  assert.equal(threadRoot(ROOT), "run_root");
  assert.equal(threadRoot(run("run_f", "x", { metadata: { [FOLLOW_UP_OF]: "run_root" } })), "run_root");
});

test("the box says why it cannot send: no conversation, or a run still going", () => {
  assert.equal(whyNot(ROOT, [{ status: "succeeded" }]), "");
  assert.match(whyNot({ ...ROOT, session: null }, []), /no conversation to continue/);
  assert.match(whyNot(ROOT, [{ status: "succeeded" }, { status: "waiting" }]), /still on the last message/);
});

test("the index reads the session's runs back to the first run's time, once for all its views", async () => {
  const pages = [
    { runs: [run("run_3", "2026-12-06T10:03:00.000Z", { metadata: { [FOLLOW_UP_OF]: "run_root" } }), run("run_other", "2026-12-06T10:02:00.000Z")], next: "cursor1" },
    { runs: [run("run_1", "2026-12-06T10:01:00.000Z", { metadata: { [FOLLOW_UP_OF]: "run_root" } }), ROOT], next: "cursor2" },
  ];
  const server = fakeServer(async () => Response.json(pages.shift() ?? { runs: [], next: null }));
  const index = new ThreadIndex({ baseUrl: "/", fetch: server.fetch });
  const [first, second] = await Promise.all([index.followUps(ROOT), index.followUps(ROOT)]);
  assert.deepEqual(first.map((r) => r.run_id), ["run_1", "run_3"]);
  assert.deepEqual(second.map((r) => r.run_id), ["run_1", "run_3"]);
  assert.equal(server.requests.length, 2, "two pages, shared by both views; none older than the first run");
  assert.match(server.requests[0].url, /runs\?session=work%2Fa.ipynb&limit=100$/);
  assert.match(server.requests[1].url, /before=cursor1/);
  index.add(run("run_4", "2026-12-06T10:04:00.000Z", { metadata: { [FOLLOW_UP_OF]: "run_root" } }));
  assert.deepEqual((await index.followUps(ROOT)).map((r) => r.run_id), ["run_1", "run_3", "run_4"]);
  assert.equal(server.requests.length, 2);
});

test("Enter sends once, Shift+Enter is a new line, and a refusal keeps the text and says why", async () => {
  const sent = [];
  let answer = null;
  const box = new FollowUpBox(async (text) => {
    sent.push(text);
    return answer;
  });
  box.text.value = "line one";
  const shift = new window.KeyboardEvent("keydown", { key: "Enter", shiftKey: true, cancelable: true });
  box.text.dispatchEvent(shift);
  assert.equal(shift.defaultPrevented, false);
  assert.deepEqual(sent, []);
  answer = "The session 'x' has an active run";
  box.text.dispatchEvent(new window.KeyboardEvent("keydown", { key: "Enter" }));
  await until(() => !box.sending);
  assert.deepEqual(sent, ["line one"]);
  assert.equal(box.text.value, "line one");
  assert.equal(box.note.textContent, "Not sent: The session 'x' has an active run");
  answer = null;
  await box.submit();
  assert.equal(box.text.value, "");
  box.setReason("The agent is still on the last message: wait for it, or cancel it.");
  assert.equal(box.text.disabled, true);
  assert.equal(box.note.textContent, "The agent is still on the last message: wait for it, or cancel it.");
  box.text.value = "blocked";
  await box.submit();
  assert.equal(sent.length, 2, "nothing is sent while it cannot");
});

test("a sent follow-up shows in the thread at once, and a network error's retry is the same run", async () => {
  let posts = 0;
  const server = fakeServer(async (url, init) => {
    if (init.method === "POST") {
      posts += 1;
      if (posts === 1) return "down";
      return Response.json(run("run_new", "2026-12-06T10:05:00.000Z", { status: "queued", metadata: init.body.metadata }), { status: 201 });
    }
    return Response.json({ runs: [ROOT], next: null });
  });
  const views = [];
  // The page's table of actions under way, as every view's RunActions share it.
  const intents = new Map();
  const section = new ThreadSection({
    baseUrl: () => "/",
    actions: () => new RunActions({ baseUrl: "/", fetch: server.fetch, intents }),
    makeView: (host, node) => {
      const view = { attached: [], attach: (id) => view.attached.push(id), dispose: () => (view.disposed = true), host, node };
      views.push(view);
      return view;
    },
    index: new ThreadIndex({ baseUrl: "/", fetch: server.fetch }),
  });
  section.show(ROOT, "succeeded");
  await until(() => server.requests.length === 1);
  section.box.text.value = "and now plot it";
  await section.box.submit();
  assert.match(section.box.note.textContent, /Not sent: cannot reach the server/);
  await section.box.submit();
  const keys = server.requests.filter((r) => r.method === "POST").map((r) => r.headers["Idempotency-Key"]);
  assert.equal(keys.length, 2);
  assert.equal(keys[0], keys[1]);
  assert.equal(views.length, 1);
  assert.deepEqual(views[0].attached, ["run_new"]);
  // The new run is going: the box waits for it, saying why.
  assert.match(section.box.note.textContent, /still on the last message/);
  views[0].host.shown({ status: "succeeded" });
  assert.equal(section.box.reason, "");
});

test("a reply being typed survives its view drawn again, with the focus and the caret; an old draft does not come back", async () => {
  const server = fakeServer(async () => Response.json({ runs: [ROOT], next: null }));
  const section = () => {
    const made = new ThreadSection({
      baseUrl: () => "/",
      actions: () => new RunActions({ baseUrl: "/", fetch: server.fetch }),
      makeView: () => ({ attach: () => {}, dispose: () => {} }),
      index: new ThreadIndex({ baseUrl: "/", fetch: server.fetch }),
    });
    document.body.append(made.node);
    return made;
  };
  const first = section();
  first.show(ROOT, "succeeded");
  first.box.text.value = "and now plot it";
  first.box.text.focus();
  first.box.text.setSelectionRange(4, 7);
  // The output is drawn again (another page's change of a shared notebook): a new view.
  first.dispose();
  first.node.remove();
  const second = section();
  second.show(ROOT, "succeeded");
  assert.equal(second.box.text.value, "and now plot it");
  assert.equal(document.activeElement, second.box.text);
  assert.deepEqual([second.box.text.selectionStart, second.box.text.selectionEnd], [4, 7]);
  assert.equal(second.box.sendButton.disabled, false, "the Send button follows the text");
  // Taken once: a third view of the run (the run page, later) starts empty.
  second.node.remove();
  const third = section();
  third.show(ROOT, "succeeded");
  assert.equal(third.box.text.value, "");

  // A draft left longer than a redraw takes is not brought back.
  third.box.text.value = "an old thought";
  third.dispose();
  const kept = globalThis.__jupyterAgentrunsDrafts.get("run_root");
  kept.at -= (DRAFT_SECONDS + 1) * 1000;
  const fourth = section();
  fourth.show(ROOT, "succeeded");
  assert.equal(fourth.box.text.value, "");
});
