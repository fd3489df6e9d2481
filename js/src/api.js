// Talking to the server from the page: same origin, cookie auth.

/**
 * @param {string} url
 * @returns {string}
 */
export function withSlash(url) {
  return url.endsWith("/") ? url : `${url}/`;
}

/**
 * An option of the page's config (JupyterLab's and Notebook's pages carry one), or null.
 * @param {string} name
 * @returns {any}
 */
export function pageOption(name) {
  if (typeof document === "undefined") return null;
  const config = document.getElementById("jupyter-config-data");
  if (!config) return null;
  // Read once per text: every view and request asks, and the page's options are long.
  const text = config.textContent || "";
  if (text !== pageOptions.text) {
    let parsed = null;
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = null;
    }
    pageOptions.text = text;
    pageOptions.values = parsed !== null && typeof parsed === "object" ? parsed : {};
  }
  return pageOptions.values[name] || null;
}

/** @type {{text: string | null, values: Record<string, any>}} */
const pageOptions = { text: null, values: {} };

function pageBaseUrl() {
  return pageOption("baseUrl");
}

/**
 * The server's base URL path: the page's config, else `fallback` (the kernel's
 * idea of it), else "/".
 * @param {string | null} [fallback]
 * @returns {string}
 */
export function apiBase(fallback = null) {
  return withSlash(pageBaseUrl() || fallback || "/");
}

/**
 * The `_xsrf` cookie that tornado wants back in `X-XSRFToken`, or null.
 * @returns {string | null}
 */
export function xsrfToken() {
  if (typeof document === "undefined") return null;
  const match = document.cookie.match(/(?:^|;\s*)_xsrf=([^;]*)/);
  return match ? match[1] : null;
}

/**
 * @typedef {Omit<RequestInit, "body" | "headers"> & {body?: unknown, headers?: Record<string, string>}} ApiInit
 * @typedef {(url: string, init?: ApiInit) => Promise<Response>} Fetch what talks to the server: apiFetch, or a test's
 */

/**
 * fetch() with cookie auth, JSON bodies, and the XSRF header on every request:
 * tornado checks it on writes only, but JupyterHub's single-user servers check
 * it on a page's reads too, and answer 403 to a GET without it.
 * @param {string} url
 * @param {ApiInit} [options]
 * @returns {Promise<Response>}
 */
export function apiFetch(url, options = {}) {
  const method = (options.method || "GET").toUpperCase();
  /** @type {Record<string, string>} */
  const headers = { Accept: "application/json", ...options.headers };
  let body = options.body;
  if (body !== undefined && typeof body !== "string") {
    body = JSON.stringify(body);
    headers["Content-Type"] = "application/json";
  }
  const token = xsrfToken();
  if (token !== null) headers["X-XSRFToken"] = token;
  return fetch(url, { ...options, method, headers, body: /** @type {string | undefined} */ (body), credentials: "same-origin" });
}

/**
 * The URL of the run API under `baseUrl`: `runsUrl("/")` is "/api/agentruns/runs".
 * @param {string} baseUrl
 * @param {string} [runId]
 * @returns {string}
 */
export function runsUrl(baseUrl, runId) {
  const runs = `${withSlash(baseUrl)}api/agentruns/runs`;
  return runId === undefined ? runs : `${runs}/${encodeURIComponent(runId)}`;
}

/**
 * A fresh Idempotency-Key.
 * @returns {string}
 */
export function newIdempotencyKey() {
  // getRandomValues works on plain-http servers too, where randomUUID does not exist.
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");
}

/**
 * What an error answer says, for a person.
 * @param {Response} response
 * @returns {Promise<string>}
 */
export async function errorMessage(response) {
  try {
    const body = await response.json();
    if (body && body.message) return body.message;
  } catch {
    // Not our JSON: fall back to the status line.
  }
  return `the server answered ${response.status}`;
}
