// The page's one stream: driven by a fake fetch and fake timers.
import assert from "node:assert/strict";
import { test } from "node:test";

import { StreamHub, MAX_RUNS_PER_STREAM, getStreamHub } from "../src/streamhub.js";

const encoder = new TextEncoder();

/** Timers that only move when the test says so. */
class FakeClock {
  constructor() {
    this.now = 0;
    this.nextId = 1;
    this.timers = new Map();
    this.setTimeout = (callback, ms) => {
      const id = this.nextId++;
      this.timers.set(id, { callback, ms, at: this.now + ms });
      return id;
    };
    this.clearTimeout = (id) => this.timers.delete(id);
  }

  /** The delays of the timers still pending. */
  delays() {
    return [...this.timers.values()].map((timer) => timer.ms);
  }

  async advance(ms) {
    const end = this.now + ms;
    for (;;) {
      const due = [...this.timers.entries()]
        .filter(([, timer]) => timer.at <= end)
        .sort(([, a], [, b]) => a.at - b.at)[0];
      if (!due) break;
      this.timers.delete(due[0]);
      this.now = due[1].at;
      due[1].callback();
      await settle();
    }
    this.now = end;
    await settle();
  }
}

// Let the hub's awaits (fetch, reader.read) run to completion.
async function settle() {
  for (let i = 0; i < 20; i++) await new Promise((resolve) => setImmediate(resolve));
}

/** A fetch whose every request the test answers by hand. */
function fakeServer() {
  const requests = [];
  const fetch = (url, init) =>
    new Promise((resolve, reject) => {
      let answered = false;
      const request = {
        url,
        init,
        runs: new URL(url, "http://localhost").searchParams.get("runs"),
        aborted: false,
        cancelled: false,
        status(code) {
          answered = true;
          resolve(new Response(null, { status: code }));
        },
        json(code, body) {
          answered = true;
          resolve(new Response(JSON.stringify(body), { status: code, headers: { "Content-Type": "application/json" } }));
          return settle();
        },
        fail() {
          answered = true;
          reject(new TypeError("Failed to fetch"));
        },
        open() {
          answered = true;
          let controller;
          const body = new ReadableStream({
            start: (c) => (controller = c),
            cancel: () => (request.cancelled = true),
          });
          request.send = (text) => {
            if (!request.cancelled) controller.enqueue(encoder.encode(text));
          };
          request.end = () => controller.close();
          request.cut = () => controller.error(new TypeError("network error"));
          resolve(new Response(body, { status: 200, headers: { "Content-Type": "text/event-stream" } }));
          return settle();
        },
      };
      init.signal?.addEventListener("abort", () => {
        request.aborted = true;
        if (!answered) reject(new DOMException("aborted", "AbortError"));
      });
      requests.push(request);
    });
  return { fetch, requests, last: () => requests[requests.length - 1] };
}

function setup({ random = () => 0 } = {}) {
  const clock = new FakeClock();
  const server = fakeServer();
  const hub = new StreamHub({
    baseUrl: "/base/",
    fetch: server.fetch,
    setTimeout: clock.setTimeout,
    clearTimeout: clock.clearTimeout,
    random,
  });
  return { clock, server, hub };
}

function recorder() {
  const log = { events: [], snapshots: [], errors: [], states: [] };
  log.listener = {
    onEvent: (envelope) => log.events.push(envelope.seq),
    onSnapshot: (run) => log.snapshots.push(run),
    onError: (frame) => log.errors.push(frame),
    onConnection: (state) => log.states.push(state),
  };
  return log;
}

function frame(runId, seq, type = "text.delta", data = { message_id: "m1", delta: "x" }) {
  const envelope = { run_id: runId, seq, type, ts: "2026-01-01T00:00:00Z", data };
  return `event: ${type}\ndata: ${JSON.stringify(envelope)}\n\n`;
}

// Register, let the debounce pass, and open the first stream.
async function connected(hub, clock, server, registrations) {
  const logs = registrations.map(([runId, cursor]) => {
    const log = recorder();
    log.unregister = hub.register(runId, cursor, log.listener);
    return log;
  });
  await clock.advance(50);
  await server.last().open();
  server.last().send("retry: 1000\n\n");
  await settle();
  return logs;
}

test("one connection carries two runs", async () => {
  const { clock, server, hub } = setup();
  const [a, b] = await connected(hub, clock, server, [["run_a", 0], ["run_b", 5]]);
  assert.equal(server.requests.length, 1);
  const request = server.requests[0];
  assert.equal(request.url, "/base/api/agentruns/streams?runs=run_a:0,run_b:5");
  assert.equal(request.init.credentials, "same-origin");
  assert.equal(request.init.headers.Accept, "text/event-stream");
  request.send(frame("run_a", 1) + ": ping\n\n" + frame("run_b", 6));
  await settle();
  assert.deepEqual(a.events, [1]);
  assert.deepEqual(b.events, [6]);
  assert.deepEqual(a.states, ["connected"]);
  assert.deepEqual(b.states, ["connected"]);
});

test("by default the stream and the hub's reads carry the XSRF token: JupyterHub's servers want it on a GET", async () => {
  const realFetch = globalThis.fetch;
  const server = fakeServer();
  globalThis.fetch = server.fetch;
  globalThis.document = { cookie: "_xsrf=tok", getElementById: () => null };
  try {
    const clock = new FakeClock();
    const hub = new StreamHub({ baseUrl: "/user/ada/", setTimeout: clock.setTimeout, clearTimeout: clock.clearTimeout });
    const [a] = await connected(hub, clock, server, [["run_a", 0]]);
    const stream = server.requests[0];
    assert.equal(stream.url, "/user/ada/api/agentruns/streams?runs=run_a:0");
    assert.equal(stream.init.headers.Accept, "text/event-stream");
    assert.equal(stream.init.headers["X-XSRFToken"], "tok");
    assert.equal(stream.init.credentials, "same-origin");
    // A stream that ends before its run did: the run is read, with the token too.
    stream.end();
    await settle();
    const read = server.last();
    assert.equal(read.url, "/user/ada/api/agentruns/runs/run_a");
    assert.equal(read.init.headers["X-XSRFToken"], "tok");
    await read.json(200, { run_id: "run_a", status: "succeeded", last_seq: 0, snapshot: {} });
    assert.equal(a.snapshots.length, 1);
  } finally {
    globalThis.fetch = realFetch;
    delete globalThis.document;
  }
});

test("registrations close together share one request", async () => {
  const { clock, server, hub } = setup();
  hub.register("run_a", 0, {});
  await clock.advance(20);
  hub.register("run_b", 0, {});
  await clock.advance(50);
  assert.equal(server.requests.length, 1);
  assert.equal(server.requests[0].runs, "run_a:0,run_b:0");
});

test("a new registration reopens the stream with every cursor", async () => {
  const { clock, server, hub } = setup();
  const [a] = await connected(hub, clock, server, [["run_a", 0]]);
  const first = server.last();
  first.send(frame("run_a", 1) + frame("run_a", 2));
  await settle();
  const b = recorder();
  hub.register("run_b", 3, b.listener);
  await clock.advance(50);
  assert.equal(server.requests.length, 2);
  assert.equal(server.last().runs, "run_a:2,run_b:3");
  assert.ok(first.aborted, "the old request is aborted");
  await server.last().open();
  server.last().send(frame("run_a", 3) + frame("run_b", 4));
  await settle();
  assert.deepEqual(a.events, [1, 2, 3]);
  assert.deepEqual(b.events, [4]);
});

test("a cut stream reconnects from the advanced cursors without duplicates", async () => {
  const { clock, server, hub } = setup();
  const [a] = await connected(hub, clock, server, [["run_a", 0]]);
  server.last().send(frame("run_a", 1) + frame("run_a", 2) + frame("run_a", 3));
  await settle();
  server.last().cut();
  await settle();
  assert.deepEqual(a.states, ["connected", "reconnecting"]);
  assert.deepEqual(clock.delays(), [1000]);
  await clock.advance(1000);
  assert.equal(server.requests.length, 2);
  assert.equal(server.last().runs, "run_a:3");
  await server.last().open();
  // A server replaying one event too many must not show it twice.
  server.last().send(frame("run_a", 3) + frame("run_a", 4));
  await settle();
  assert.deepEqual(a.events, [1, 2, 3, 4]);
  assert.deepEqual(a.states, ["connected", "reconnecting", "connected"]);
});

function runObject(runId, status, lastSeq) {
  return { run_id: runId, status, last_seq: lastSeq, snapshot: { messages: [], tools: [], progress: null, usage: null } };
}

test("a stream that ends before a run did reads the run, then reopens", async () => {
  const { clock, server, hub } = setup();
  const [a] = await connected(hub, clock, server, [["run_a", 0]]);
  server.last().send(frame("run_a", 1));
  server.last().end();
  await settle();
  assert.equal(server.last().url, "/base/api/agentruns/runs/run_a");
  await server.last().json(200, runObject("run_a", "running", 1));
  assert.deepEqual(a.snapshots.map((run) => run.last_seq), [1]);
  assert.deepEqual(clock.delays(), [1000]);
  await clock.advance(1000);
  assert.equal(server.requests.length, 3);
  assert.equal(server.last().runs, "run_a:1");
});

test("a run whose terminal event was lost ends from its run object", async () => {
  const { clock, server, hub } = setup();
  const [a] = await connected(hub, clock, server, [["run_a", 0]]);
  server.last().send(frame("run_a", 1));
  server.last().end();
  await settle();
  await server.last().json(200, runObject("run_a", "succeeded", 2));
  assert.deepEqual(a.snapshots.map((run) => run.status), ["succeeded"]);
  await clock.advance(60000);
  assert.equal(server.requests.length, 2, "no reconnect for a finished run");
  assert.equal(hub.state, "idle");
});

test("a 204 means the runs had ended at their cursors: they are read", async () => {
  const { clock, server, hub } = setup();
  const a = recorder();
  hub.register("run_a", 5, a.listener);
  await clock.advance(50);
  server.last().status(204);
  await settle();
  await server.last().json(200, runObject("run_a", "cancelled", 5));
  assert.deepEqual(a.snapshots.map((run) => run.status), ["cancelled"]);
  await clock.advance(60000);
  assert.equal(server.requests.length, 2);
});

test("a run read after the stream ended that is gone gets an error", async () => {
  const { clock, server, hub } = setup();
  const [a] = await connected(hub, clock, server, [["run_a", 0]]);
  server.last().end();
  await settle();
  const gone = { error: "run_expired", message: "deleted by retention" };
  await server.last().json(410, gone);
  assert.deepEqual(a.errors, [{ run_id: "run_a", error: gone }]);
  await clock.advance(60000);
  assert.equal(server.requests.length, 2);
});

test("backoff doubles up to 30 s", async () => {
  const { clock, server, hub } = setup({ random: () => 1 });
  hub.register("run_a", 0, {});
  await clock.advance(50);
  const delays = [];
  for (let attempt = 0; attempt < 7; attempt++) {
    server.last().fail();
    await settle();
    delays.push(...clock.delays());
    await clock.advance(clock.delays()[0]);
  }
  assert.deepEqual(delays, [2000, 4000, 8000, 16000, 30000, 30000, 30000]);
  assert.equal(server.requests.length, 8);
});

test("backoff is jittered between the floor and its ceiling", async () => {
  const randoms = [0.25, 0.75, 0.5];
  const { clock, server, hub } = setup({ random: () => randoms.shift() });
  hub.register("run_a", 0, {});
  await clock.advance(50);
  const delays = [];
  for (let attempt = 0; attempt < 3; attempt++) {
    server.last().fail();
    await settle();
    delays.push(...clock.delays());
    await clock.advance(clock.delays()[0]);
  }
  // Ceilings 2000, 4000, 8000 above the 1000 ms floor.
  assert.deepEqual(delays, [1250, 3250, 4500]);
});

test("the server's retry: is the floor of the backoff", async () => {
  const { clock, server, hub } = setup({ random: () => 0 });
  await connected(hub, clock, server, [["run_a", 0]]);
  server.last().send("retry: 5000\n\n");
  await settle();
  server.last().cut();
  await settle();
  assert.deepEqual(clock.delays(), [5000]);
  await clock.advance(4999);
  assert.equal(server.requests.length, 1, "not before the floor");
  await clock.advance(1);
  assert.equal(server.requests.length, 2);
});

test("a successful connection resets the backoff", async () => {
  const { clock, server, hub } = setup({ random: () => 1 });
  hub.register("run_a", 0, {});
  await clock.advance(50);
  for (let attempt = 0; attempt < 3; attempt++) {
    server.last().fail();
    await settle();
    await clock.advance(clock.delays()[0]);
  }
  await server.last().open();
  server.last().cut();
  await settle();
  assert.deepEqual(clock.delays(), [2000]);
});

test("403 means signed out, and the hub looks again every 30 s", async () => {
  const { clock, server, hub } = setup();
  const a = recorder();
  hub.register("run_a", 0, a.listener);
  await clock.advance(50);
  server.last().status(403);
  await settle();
  assert.deepEqual(a.states, ["signed_out"]);
  assert.deepEqual(clock.delays(), [30000]);
  await clock.advance(30000);
  assert.equal(server.requests.length, 2);
  await server.last().open();
  assert.deepEqual(a.states, ["signed_out", "connected"]);
});

test("401 also means signed out", async () => {
  const { clock, server, hub } = setup();
  const a = recorder();
  hub.register("run_a", 0, a.listener);
  await clock.advance(50);
  server.last().status(401);
  await settle();
  assert.deepEqual(a.states, ["signed_out"]);
});

test("another error status means reconnecting, with backoff", async () => {
  const { clock, server, hub } = setup();
  const a = recorder();
  hub.register("run_a", 0, a.listener);
  await clock.advance(50);
  server.last().status(502);
  await settle();
  assert.deepEqual(a.states, ["reconnecting"]);
  assert.deepEqual(clock.delays(), [1000]);
});

test("a run finished by its terminal event is dropped from the next connection", async () => {
  const { clock, server, hub } = setup();
  const [a, b] = await connected(hub, clock, server, [["run_a", 0], ["run_b", 0]]);
  server.last().send(frame("run_a", 1) + frame("run_a", 2, "run.succeeded", { output: 1 }) + frame("run_b", 1));
  await settle();
  assert.deepEqual(a.events, [1, 2]);
  server.last().cut();
  await settle();
  await clock.advance(1000);
  assert.equal(server.last().runs, "run_b:1");
  a.unregister(); // what a view does on terminal: harmless once the hub let the run go
  await clock.advance(50);
  assert.equal(server.requests.length, 2);
  assert.deepEqual(b.events, [1]);
});

test("a view that stops following on the terminal event does not make the hub reopen", async () => {
  const { clock, server, hub } = setup();
  const [, b] = await connected(hub, clock, server, [["run_a", 0], ["run_b", 0]]);
  const unregister = hub.register("run_a", 0, {
    onEvent: (envelope) => envelope.type === "run.succeeded" && unregister(),
  });
  server.last().send(frame("run_a", 1, "run.succeeded", { output: 1 }));
  await settle();
  await clock.advance(50);
  assert.equal(server.requests.length, 1);
  server.last().send(frame("run_b", 1));
  await settle();
  assert.deepEqual(b.events, [1]);
});

test("when the last run ends the hub closes and does not reconnect", async () => {
  const { clock, server, hub } = setup();
  await connected(hub, clock, server, [["run_a", 0]]);
  server.last().send(frame("run_a", 1, "run.cancelled", { reason: "r", stage: null }));
  server.last().end();
  await settle();
  await clock.advance(60000);
  assert.equal(server.requests.length, 1);
  assert.equal(hub.state, "idle");
});

test("a snapshot frame sets the run's cursor to its last_seq", async () => {
  const { clock, server, hub } = setup();
  const [a] = await connected(hub, clock, server, [["run_a", 0]]);
  const run = { run_id: "run_a", status: "running", last_seq: 40, first_seq: 30, snapshot: {} };
  server.last().send(`event: snapshot\ndata: ${JSON.stringify(run)}\n\n`);
  server.last().send(frame("run_a", 40) + frame("run_a", 41));
  await settle();
  assert.deepEqual(a.snapshots, [run]);
  assert.deepEqual(a.events, [41], "events the snapshot holds are not delivered again");
  server.last().cut();
  await settle();
  await clock.advance(1000);
  assert.equal(server.last().runs, "run_a:41");
});

test("a snapshot of a finished run finishes it", async () => {
  const { clock, server, hub } = setup();
  const [a] = await connected(hub, clock, server, [["run_a", 0], ["run_b", 0]]);
  const run = { run_id: "run_a", status: "succeeded", last_seq: 9, snapshot: {} };
  server.last().send(`event: snapshot\ndata: ${JSON.stringify(run)}\n\n`);
  await settle();
  server.last().cut();
  await settle();
  await clock.advance(1000);
  assert.equal(a.snapshots.length, 1);
  assert.equal(server.last().runs, "run_b:0");
});

test("an error frame finishes only its run", async () => {
  const { clock, server, hub } = setup();
  const [a, b] = await connected(hub, clock, server, [["run_a", 0], ["run_b", 0]]);
  const error = { run_id: "run_b", error: { error: "run_not_found", message: "no such run" } };
  server.last().send(`event: error\ndata: ${JSON.stringify(error)}\n\n` + frame("run_a", 1));
  await settle();
  assert.deepEqual(b.errors, [error]);
  assert.deepEqual(a.errors, []);
  assert.deepEqual(a.events, [1]);
  server.last().cut();
  await settle();
  await clock.advance(1000);
  assert.equal(server.last().runs, "run_a:1");
});

test("unregistering the last run closes the stream", async () => {
  const { clock, server, hub } = setup();
  const [a] = await connected(hub, clock, server, [["run_a", 0]]);
  a.unregister();
  await clock.advance(50);
  assert.ok(server.last().aborted);
  assert.ok(server.last().cancelled);
  assert.equal(server.requests.length, 1);
  assert.equal(hub.state, "idle");
  await clock.advance(60000);
  assert.equal(server.requests.length, 1);
});

test("unregistering one of two runs reopens with the other only", async () => {
  const { clock, server, hub } = setup();
  const [a] = await connected(hub, clock, server, [["run_a", 0], ["run_b", 0]]);
  a.unregister();
  await clock.advance(50);
  assert.equal(server.requests.length, 2);
  assert.equal(server.last().runs, "run_b:0");
});

test("two views of one run each get every event once", async () => {
  const { clock, server, hub } = setup();
  const [first] = await connected(hub, clock, server, [["run_a", 0]]);
  server.last().send(frame("run_a", 1) + frame("run_a", 2));
  await settle();
  // A second view that rendered the run at seq 2 needs nothing older: no reopen.
  const second = recorder();
  hub.register("run_a", 2, second.listener);
  await clock.advance(50);
  assert.equal(server.requests.length, 1);
  // A third view that has only seq 1 makes the hub rewind for it.
  const third = recorder();
  hub.register("run_a", 1, third.listener);
  await clock.advance(50);
  assert.equal(server.requests.length, 2);
  assert.equal(server.last().runs, "run_a:1");
  await server.last().open();
  server.last().send(frame("run_a", 2) + frame("run_a", 3));
  await settle();
  assert.deepEqual(first.events, [1, 2, 3]);
  assert.deepEqual(second.events, [3]);
  assert.deepEqual(third.events, [2, 3]);
});

test("a listener that throws does not stop the others", async () => {
  const { clock, server, hub } = setup();
  const quiet = console.error;
  console.error = () => {};
  try {
    hub.register("run_a", 0, { onEvent: () => { throw new Error("boom"); } });
    const [b] = await connected(hub, clock, server, [["run_a", 0]]);
    server.last().send(frame("run_a", 1) + frame("run_a", 2));
    await settle();
    assert.deepEqual(b.events, [1, 2]);
  } finally {
    console.error = quiet;
  }
});

test(`beyond ${MAX_RUNS_PER_STREAM} runs, the rest wait for a run to finish`, async () => {
  const { clock, server, hub } = setup();
  const registrations = Array.from({ length: MAX_RUNS_PER_STREAM + 1 }, (_, i) => [`run_${i}`, 0]);
  await connected(hub, clock, server, registrations);
  assert.equal(server.last().runs.split(",").length, MAX_RUNS_PER_STREAM);
  assert.ok(!server.last().runs.includes(`run_${MAX_RUNS_PER_STREAM}:`));
  server.last().send(frame("run_0", 1, "run.succeeded", { output: null }));
  await settle();
  await clock.advance(50);
  assert.equal(server.requests.length, 2);
  assert.ok(server.last().runs.includes(`run_${MAX_RUNS_PER_STREAM}:0`));
  assert.ok(!server.last().runs.includes("run_0:"));
});

test("two copies of the module share one hub through globalThis", async () => {
  delete globalThis.__jupyterAgentrunsHub;
  try {
    const one = await import("../src/streamhub.js?copy=1");
    const two = await import("../src/streamhub.js?copy=2");
    assert.notEqual(one.StreamHub, two.StreamHub, "really two copies");
    const clock = new FakeClock();
    const server = fakeServer();
    const hub = one.getStreamHub({ baseUrl: "/", fetch: server.fetch, setTimeout: clock.setTimeout, clearTimeout: clock.clearTimeout });
    assert.equal(two.getStreamHub(), hub);
    assert.equal(getStreamHub(), hub);
    const a = recorder();
    const b = recorder();
    one.getStreamHub().register("run_a", 0, a.listener);
    two.getStreamHub().register("run_b", 0, b.listener);
    await clock.advance(50);
    assert.equal(server.requests.length, 1);
    assert.equal(server.last().runs, "run_a:0,run_b:0");
    await server.last().open();
    server.last().send(frame("run_b", 1));
    await settle();
    assert.deepEqual(b.events, [1]);
  } finally {
    delete globalThis.__jupyterAgentrunsHub;
  }
});
