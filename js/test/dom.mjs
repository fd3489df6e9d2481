// A DOM for the view's tests: jsdom's window as the page's globals.
import { JSDOM } from "jsdom";

/** Install a fresh page; returns its window. */
export function installPage(config = { baseUrl: "/" }) {
  const dom = new JSDOM(
    `<!doctype html><body><script id="jupyter-config-data" type="application/json">${JSON.stringify(config)}</script></body>`,
    { url: "http://localhost/" }
  );
  const { window } = dom;
  for (const name of ["window", "document", "navigator", "HTMLElement", "Node", "DocumentFragment", "Element", "Event", "CustomEvent"]) {
    Object.defineProperty(globalThis, name, { value: name === "window" ? window : window[name], configurable: true, writable: true });
  }
  window.document.cookie = "_xsrf=tok";
  return window;
}

/** Wait a fixed time: only to show that something does NOT happen within it. */
export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Wait until `predicate()` holds, polling: what a test waits for is a condition, not a time.
 * Returns the predicate's value; fails saying what it waited for after `timeout` ms.
 * @param {() => any} predicate
 * @param {{timeout?: number, interval?: number, what?: string}} [options]
 */
export async function until(predicate, { timeout = 5000, interval = 5, what = predicate.toString() } = {}) {
  const deadline = performance.now() + timeout; // not Date.now(): a test may stop that clock
  for (;;) {
    let value;
    let error = null;
    try {
      value = predicate();
    } catch (caught) {
      error = caught;
    }
    if (value) return value;
    if (performance.now() > deadline) {
      const why = error === null ? "" : ` (last try threw: ${error instanceof Error ? error.message : error})`;
      throw new Error(`waited ${timeout} ms for ${what}${why}`);
    }
    await sleep(interval);
  }
}
