// Talking to the server from the page: base URL, XSRF token, fetch options.
import assert from "node:assert/strict";
import { afterEach, test } from "node:test";

import { apiBase, apiFetch, backoffDelay, xsrfToken } from "../widget.js";

const realFetch = globalThis.fetch;

function fakePage({ config, cookie = "" }) {
  globalThis.document = {
    cookie,
    getElementById: (id) => (id === "jupyter-config-data" && config !== undefined ? { textContent: config } : null),
  };
}

function fakeModel(traits) {
  return { get: (name) => traits[name] };
}

afterEach(() => {
  delete globalThis.document;
  globalThis.fetch = realFetch;
});

test("the base URL comes from the page's config first", () => {
  fakePage({ config: JSON.stringify({ baseUrl: "/user/ada/" }) });
  assert.equal(apiBase(fakeModel({ base_url: "/elsewhere/" })), "/user/ada/");
});

test("without page config the model's base_url is used, then /", () => {
  fakePage({});
  assert.equal(apiBase(fakeModel({ base_url: "/a%40b" })), "/a%40b/");
  assert.equal(apiBase(fakeModel({ base_url: "" })), "/");
  delete globalThis.document;
  assert.equal(apiBase(fakeModel({ base_url: "/kernel/" })), "/kernel/");
  assert.equal(apiBase(undefined), "/");
});

test("unreadable page config falls back to the model", () => {
  fakePage({ config: "{not json" });
  assert.equal(apiBase(fakeModel({ base_url: "/b/" })), "/b/");
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

test("apiFetch sends the XSRF header on DELETE but not on GET", async () => {
  fakePage({ cookie: "_xsrf=tok" });
  const calls = [];
  globalThis.fetch = async (url, init) => calls.push(init);
  await apiFetch("/x", { method: "DELETE" });
  await apiFetch("/x");
  assert.equal(calls[0].headers["X-XSRFToken"], "tok");
  assert.equal(calls[1].headers["X-XSRFToken"], undefined);
  assert.equal(calls[1].method, "GET");
});

test("backoff stays between the floor and a doubling ceiling capped at 30 s", () => {
  assert.equal(backoffDelay(1, 1000, () => 0), 1000);
  assert.equal(backoffDelay(1, 1000, () => 1), 2000);
  assert.equal(backoffDelay(3, 1000, () => 0.5), 4500);
  assert.equal(backoffDelay(20, 1000, () => 1), 30000);
  assert.equal(backoffDelay(1, 45000, () => 1), 45000, "a floor above the cap wins");
});
