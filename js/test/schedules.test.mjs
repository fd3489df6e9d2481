// The runs panel's schedules: each with its agent, cron, next time and last runs; hidden while none.
import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";
import { installPage, until } from "./dom.mjs";

installPage();
const { ScheduleList, nextWords, schedulesUrl } = await import("../src/schedules.js");
const { RunsPanel } = await import("../src/panel.js");

const NOW = Date.parse("2026-12-07T08:00:00.000Z");

const schedule = (fields = {}) => ({
  schedule_id: "sch_a", agent: "demo", cron: "0 9 * * 1-5", timezone: "Europe/Paris", session: null,
  paused: false, next_at: "2026-12-07T08:30:00Z", last_error: null, skipped: 0,
  last_runs: [
    { run_id: "run_2", status: "running", created_at: "2026-12-07T07:59:00Z", finished_at: null },
    { run_id: "run_1", status: "failed", created_at: "2026-12-06T08:00:00Z", finished_at: "2026-12-06T08:01:00Z" },
  ],
  ...fields,
});

function answering(body, status = 200) {
  const requests = [];
  const fetch = async (url) => {
    requests.push(url);
    return Response.json(body, { status });
  };
  return { fetch, requests };
}

beforeEach(() => installPage());

test("the next time in words", () => {
  assert.equal(nextWords(schedule(), NOW), "next in 30 min");
  assert.equal(nextWords(schedule({ next_at: "2026-12-07T08:00:20Z" }), NOW), "next in 20 s");
  assert.equal(nextWords(schedule({ next_at: "2026-12-07T07:00:00Z" }), NOW), "next now");
  assert.equal(nextWords(schedule({ next_at: "2026-12-08T09:00:00Z" }), NOW), "next in 25 h");
  assert.equal(nextWords(schedule({ next_at: "2026-12-20T09:00:00Z" }), NOW), "next in 13 days");
  assert.equal(nextWords(schedule({ paused: true, next_at: null }), NOW), "paused");
  assert.equal(schedulesUrl("/user/me"), "/user/me/api/agentruns/schedules");
});

test("each schedule shows its agent, cron, zone, next time and last runs; a run opens on a click", async () => {
  const server = answering({ schedules: [schedule(), schedule({ schedule_id: "sch_b", paused: true, next_at: null, last_runs: [], last_error: "2026-12-07T07:00:00Z: too_many_active_runs: wait" }), { schedule_id: 3 }] });
  const opened = [];
  const list = new ScheduleList({ baseUrl: "/base/", fetch: server.fetch, openRun: (id) => opened.push(id), now: () => NOW });
  assert.equal(list.node.hidden, true);
  await list.load();
  assert.deepEqual(server.requests, ["/base/api/agentruns/schedules"]);
  assert.equal(list.node.hidden, false);
  assert.equal(list.summary.textContent, "Schedules (2)"); // what is not a schedule is left out
  const [a, b] = list.list.querySelectorAll(".agentruns-schedule");
  assert.equal(a.querySelector(".agentruns-schedule-agent").textContent, "demo");
  assert.equal(a.querySelector(".agentruns-schedule-cron").textContent, "0 9 * * 1-5");
  assert.equal(a.querySelector(".agentruns-schedule-zone").textContent, "Europe/Paris");
  assert.equal(a.querySelector(".agentruns-schedule-next").textContent, "next in 30 min");
  const chips = [...a.querySelectorAll(".agentruns-schedule-run")];
  assert.deepEqual(chips.map((chip) => chip.textContent), ["running", "failed"]);
  assert.equal(chips[0].title, "run_2, 1 min ago");
  chips[1].click();
  assert.deepEqual(opened, ["run_1"]);
  assert.equal(b.dataset.paused, "true");
  assert.equal(b.querySelector(".agentruns-schedule-next").textContent, "paused");
  assert.equal(b.querySelector(".agentruns-schedule-none").textContent, "no run yet");
  assert.match(b.querySelector(".agentruns-schedule-error").textContent, /too_many_active_runs/);
});

test("no schedule, or a server without them, leaves the section hidden", async () => {
  const none = new ScheduleList({ baseUrl: "/", fetch: answering({ schedules: [] }).fetch });
  await none.load();
  assert.equal(none.node.hidden, true);
  const older = new ScheduleList({ baseUrl: "/", fetch: answering({ error: "not_found", message: "no" }, 404).fetch });
  await older.load();
  assert.equal(older.node.hidden, true);
  const down = new ScheduleList({ baseUrl: "/", fetch: async () => { throw new TypeError("offline"); } });
  await down.load();
  assert.equal(down.node.hidden, true);
});

test("the panel shows its schedules above the runs when asked to, and reads them when shown", async () => {
  const paths = [];
  globalThis.fetch = async (url) => {
    const path = new URL(url, "http://localhost").pathname;
    paths.push(path);
    if (path === "/api/agentruns/schedules") return Response.json({ schedules: [schedule()] });
    return Response.json({ runs: [], next: null });
  };
  const hub = { register: () => () => {} };
  const plain = new RunsPanel({ baseUrl: "/", hub, setInterval: () => 0, clearInterval: () => {} });
  assert.equal(plain.schedules, null);
  const panel = new RunsPanel({ baseUrl: "/", hub, schedules: true, now: () => NOW, setInterval: () => 0, clearInterval: () => {} });
  document.body.replaceChildren(panel.node);
  panel.show();
  await panel.refresh();
  await until(() => !panel.schedules.node.hidden, { what: "the schedules read" });
  assert.ok(paths.includes("/api/agentruns/schedules"));
  assert.equal(panel.schedules.node.hidden, false);
  const children = [...panel.node.children];
  assert.ok(children.indexOf(panel.schedules.node) < children.indexOf(panel.list));
  panel.dispose();
  plain.dispose();
});
