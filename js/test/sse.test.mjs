// The text/event-stream parser, fed the way a network delivers bytes.
import assert from "node:assert/strict";
import { test } from "node:test";

import { SSEParser } from "../src/sse.js";

const delta = '{"run_id":"run_a","seq":7,"type":"text.delta","ts":"t","data":{"message_id":"m1","delta":"Hé 🌏"}}';
const snapshot = '{"run_id":"run_b","last_seq":40,"status":"running"}';

// What the streams endpoint sends: retry first, pings, named events, no ids.
const recorded = [
  "retry: 1000\n\n",
  ": ping\n\n",
  `event: text.delta\ndata: ${delta}\n\n`,
  ": ping\n\n",
  `event: snapshot\ndata: ${snapshot}\n\n`,
  "event: x.note\ndata: first line\ndata:second line\ndata\n\n",
].join("");

const expected = [
  { event: "message", data: null, id: null, retry: 1000 },
  { event: "text.delta", data: delta, id: null, retry: null },
  { event: "snapshot", data: snapshot, id: null, retry: null },
  { event: "x.note", data: "first line\nsecond line\n", id: null, retry: null },
];

function feedAll(chunks) {
  const parser = new SSEParser();
  return chunks.flatMap((chunk) => parser.feed(chunk));
}

test("a recorded stream in one chunk", () => {
  assert.deepStrictEqual(feedAll([recorded]), expected);
});

test("a recorded stream split at every character boundary", () => {
  for (let i = 0; i <= recorded.length; i++) {
    assert.deepStrictEqual(feedAll([recorded.slice(0, i), recorded.slice(i)]), expected, `split at ${i}`);
  }
});

test("a recorded stream one character at a time", () => {
  assert.deepStrictEqual(feedAll([...recorded]), expected);
});

test("CRLF line ends, split at every boundary, including between CR and LF", () => {
  const crlf = recorded.replaceAll("\n", "\r\n");
  for (let i = 0; i <= crlf.length; i++) {
    assert.deepStrictEqual(feedAll([crlf.slice(0, i), crlf.slice(i)]), expected, `split at ${i}`);
  }
});

test("lone CR line ends", () => {
  assert.deepStrictEqual(feedAll([recorded.replaceAll("\n", "\r")]), expected);
});

test("a frame is only dispatched at its blank line", () => {
  const parser = new SSEParser();
  assert.deepStrictEqual(parser.feed("event: progress\ndata: {}\n"), []);
  assert.deepStrictEqual(parser.feed("\n"), [{ event: "progress", data: "{}", id: null, retry: null }]);
});

test("comments alone produce nothing", () => {
  assert.deepStrictEqual(feedAll([": ping\n\n:another\n\n"]), []);
});

test("retry takes only digits", () => {
  assert.deepStrictEqual(feedAll(["retry: 2500\n\n", "retry: soon\n\n", "retry: 1e3\n\n"]), [
    { event: "message", data: null, id: null, retry: 2500 },
  ]);
});

test("retry may come with data", () => {
  assert.deepStrictEqual(feedAll(["retry: 3000\ndata: x\n\n"]), [{ event: "message", data: "x", id: null, retry: 3000 }]);
});

test("the last event id is kept across frames", () => {
  assert.deepStrictEqual(feedAll(["id: 7\ndata: a\n\n", "data: b\n\n"]), [
    { event: "message", data: "a", id: "7", retry: null },
    { event: "message", data: "b", id: "7", retry: null },
  ]);
});

test("only one space after the colon is dropped", () => {
  assert.deepStrictEqual(feedAll(["data:  two spaces\n\n"]), [{ event: "message", data: " two spaces", id: null, retry: null }]);
});

test("a byte order mark at the start is ignored", () => {
  assert.deepStrictEqual(feedAll(["\uFEFFdata: x\n\n"]), [{ event: "message", data: "x", id: null, retry: null }]);
});

test("an unfinished frame at the end of the stream is not dispatched", () => {
  assert.deepStrictEqual(feedAll(["data: complete\n\ndata: cut"]), [{ event: "message", data: "complete", id: null, retry: null }]);
});

test("the event name does not leak into the next frame", () => {
  assert.deepStrictEqual(feedAll(["event: a\ndata: 1\n\ndata: 2\n\n"]).map((frame) => frame.event), ["a", "message"]);
});

test("the recorded bytes split at every byte boundary, inside characters too", () => {
  const bytes = new TextEncoder().encode(recorded);
  for (let i = 0; i <= bytes.length; i++) {
    const decoder = new TextDecoder();
    const parser = new SSEParser();
    const frames = [
      ...parser.feed(decoder.decode(bytes.slice(0, i), { stream: true })),
      ...parser.feed(decoder.decode(bytes.slice(i), { stream: true })),
    ];
    assert.deepStrictEqual(frames, expected, `split at byte ${i}`);
  }
});
