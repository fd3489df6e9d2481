// Server-sent events, parsed incrementally as the WHATWG spec says.

const LINE_END = /\r\n|\r|\n/g;

/**
 * One dispatched frame: `data` is null for a frame that only set `retry` (ms,
 * else null); `id` is the last event id seen, else null.
 * @typedef {{event: string, data: string | null, id: string | null, retry: number | null}} Frame
 */

/** An incremental text/event-stream parser: `feed(chunk)` returns the frames that chunk completed. */
export class SSEParser {
  constructor() {
    /** @type {string[]} the line being received, in chunks */
    this.pieces = [];
    this.started = false;
    this.skipLineFeed = false;
    /** @type {string | null} */
    this.lastEventId = null;
    this.event = "";
    /** @type {string[]} */
    this.data = [];
    /** @type {number | null} */
    this.retry = null;
  }

  /**
   * @param {string} chunk
   * @returns {Frame[]}
   */
  feed(chunk) {
    let text = chunk;
    if (!this.started && text.length > 0) {
      this.started = true;
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
    }
    // A chunk ending in "\r" may be half of a "\r\n" split across chunks.
    if (this.skipLineFeed && text.length > 0) {
      this.skipLineFeed = false;
      if (text[0] === "\n") text = text.slice(1);
    }
    /** @type {Frame[]} */
    const frames = [];
    let start = 0;
    let match;
    LINE_END.lastIndex = 0;
    while ((match = LINE_END.exec(text)) !== null) {
      if (match[0] === "\r" && match.index === text.length - 1) this.skipLineFeed = true;
      // Joining the pieces of a long line only once keeps a big frame linear in its size.
      const piece = text.slice(start, match.index);
      const line = this.pieces.length === 0 ? piece : this.pieces.join("") + piece;
      this.pieces = [];
      this._line(line, frames);
      start = LINE_END.lastIndex;
    }
    if (start < text.length) this.pieces.push(text.slice(start));
    return frames;
  }

  /**
   * @param {string} line
   * @param {Frame[]} frames
   */
  _line(line, frames) {
    if (line === "") {
      this._dispatch(frames);
      return;
    }
    if (line[0] === ":") return; // a comment, e.g. ": ping"
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value[0] === " ") value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.event = value;
    else if (field === "id" && !value.includes("\0")) this.lastEventId = value;
    else if (field === "retry" && /^\d+$/.test(value)) this.retry = Number(value);
  }

  /** @param {Frame[]} frames */
  _dispatch(frames) {
    if (this.data.length > 0 || this.retry !== null) {
      frames.push({
        event: this.event || "message",
        data: this.data.length > 0 ? this.data.join("\n") : null,
        id: this.lastEventId,
        retry: this.retry,
      });
    }
    this.event = "";
    this.data = [];
    this.retry = null;
  }
}
