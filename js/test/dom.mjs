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

/** Wait for timers and promises. */
export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
