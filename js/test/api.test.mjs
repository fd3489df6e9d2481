// Talking to the server from the page: base URL, XSRF token, fetch options.
import assert from "node:assert/strict";
import { afterEach, test } from "node:test";

import { apiBase, apiFetch, errorMessage, newIdempotencyKey, runsUrl, xsrfToken } from "../src/api.js";

const realFetch = globalThis.fetch;

function fakePage({ config, cookie = "" }) {
  globalThis.document = {
    cookie,
    getElementById: (id) => (id === "jupyter-config-data" && config !== undefined ? { textContent: config } : null),
  };
}

afterEach(() => {
  delete globalThis.document;
  globalThis.fetch = realFetch;
});

test("the base URL comes from the page's config first", () => {
  fakePage({ config: JSON.stringify({ baseUrl: "/user/ada/" }) });
  assert.equal(apiBase("/elsewhere/"), "/user/ada/");
});

test("without page config the kernel's base_url is used, then /", () => {
  fakePage({});
  assert.equal(apiBase("/a%40b"), "/a%40b/");
  assert.equal(apiBase(""), "/");
  delete globalThis.document;
  assert.equal(apiBase("/kernel/"), "/kernel/");
  assert.equal(apiBase(), "/");
});

test("unreadable page config falls back to the kernel's base_url", () => {
  fakePage({ config: "{not json" });
  assert.equal(apiBase("/b/"), "/b/");
});

test("run URLs escape the run id", () => {
  assert.equal(runsUrl("/a%40b"), "/a%40b/api/agentruns/runs");
  assert.equal(runsUrl("/", "run_x/../y"), "/api/agentruns/runs/run_x%2F..%2Fy");
});

test("idempotency keys are 32 hex digits, a new one each time", () => {
  const key = newIdempotencyKey();
  assert.match(key, /^[0-9a-f]{32}$/);
  assert.notEqual(newIdempotencyKey(), key);
});

test("an error answer's message is shown, else its status", async () => {
  assert.equal(await errorMessage(new Response('{"error":"x","message":"Too many runs"}', { status: 429 })), "Too many runs");
  assert.equal(await errorMessage(new Response("<html>", { status: 502 })), "the server answered 502");
});

test("the XSRF token is the _xsrf cookie, as is", () => {
  fakePage({ cookie: "other=1; _xsrf=2|abc|def|123; x_xsrf=no" });
  assert.equal(xsrfToken(), "2|abc|def|123");
  fakePage({ cookie: "not_xsrf=1" });
  assert.equal(xsrfToken(), null);
  delete globalThis.document;
  assert.equal(xsrfToken(), null);
});

test("apiFetch sends JSON with cookie auth and the XSRF header on a POST", async () => {
  fakePage({ cookie: "_xsrf=tok" });
  const calls = [];
  globalThis.fetch = async (url, init) => calls.push([url, init]);
  await apiFetch("/api/agentruns/runs", { method: "POST", headers: { "Idempotency-Key": "k" }, body: { agent: "demo" } });
  const [url, init] = calls[0];
  assert.equal(url, "/api/agentruns/runs");
  assert.equal(init.credentials, "same-origin");
  assert.equal(init.body, '{"agent":"demo"}');
  assert.equal(init.headers["Content-Type"], "application/json");
  assert.equal(init.headers["X-XSRFToken"], "tok");
  assert.equal(init.headers["Idempotency-Key"], "k");
});

test("apiFetch sends the XSRF header on reads too: JupyterHub's servers check it on a GET", async () => {
  fakePage({ cookie: "_xsrf=tok" });
  const calls = [];
  globalThis.fetch = async (url, init) => calls.push(init);
  await apiFetch("/x", { method: "DELETE" });
  await apiFetch("/x");
  await apiFetch("/x", { headers: { Accept: "text/event-stream" } });
  assert.deepEqual(
    calls.map((init) => [init.method, init.headers["X-XSRFToken"]]),
    [["DELETE", "tok"], ["GET", "tok"], ["GET", "tok"]],
  );
  assert.equal(calls[2].headers.Accept, "text/event-stream");
  // No cookie (a token login): no header.
  fakePage({});
  await apiFetch("/x");
  assert.equal("X-XSRFToken" in calls[3].headers, false);
});
