// Server-Sent Events over fetch(): EventSource cannot send an Authorization header, so the dashboard reads
// /api/v1/events/stream as a byte stream and parses it here (the WHATWG "event stream interpretation" rules:
// any of CRLF, LF, CR ends a line; a blank line dispatches; ':' starts a comment; one space after the colon is
// dropped; data lines join with '\n'). SseParser is pure and tested in the browser (tests/browser).

export class SseParser {
  constructor() {
    this.buffer = "";
    this.pendingCR = false; // a chunk ended in '\r': a '\n' opening the next chunk belongs to the same line end
    this.lastEventId = "";
    this.retry = null;
    this._reset();
  }

  _reset() {
    this.data = [];
    this.type = "";
    this.hasData = false;
  }

  // Feed decoded text; returns the messages completed by it:
  // {kind: "event", type, data, id} or {kind: "comment", text}.
  push(text) {
    const out = [];
    if (this.pendingCR && text.startsWith("\n")) text = text.slice(1);
    this.pendingCR = false;
    let start = 0;
    const all = this.buffer + text;
    this.buffer = "";
    for (let i = 0; i < all.length; i++) {
      const c = all.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      this._line(all.slice(start, i), out);
      if (c === 13) {
        if (i + 1 < all.length) {
          if (all.charCodeAt(i + 1) === 10) i++;
        } else {
          this.pendingCR = true;
        }
      }
      start = i + 1;
    }
    this.buffer = all.slice(start);
    return out;
  }

  _line(line, out) {
    if (line === "") {
      if (this.hasData) {
        out.push({kind: "event", type: this.type || "message", data: this.data.join("\n"), id: this.lastEventId});
      }
      this._reset();
      return;
    }
    if (line.startsWith(":")) {
      out.push({kind: "comment", text: line.slice(1).replace(/^ /, "")});
      return;
    }
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") {
      this.data.push(value);
      this.hasData = true;
    } else if (field === "event") {
      this.type = value;
    } else if (field === "id") {
      if (!value.includes("\0")) this.lastEventId = value;
    } else if (field === "retry") {
      if (/^\d+$/.test(value)) this.retry = Number(value);
    }
  }
}

const KEEPALIVE_TIMEOUT_MS = 45000; // the server comments every 15 s; three missed ones mean a dead connection
const MAX_BACKOFF_MS = 15000;
const SLICE_CHARS = 65536;
const SLICE_MS = 8;

// Follows the event stream until `signal` aborts: reconnects with backoff and resumes after the last event id
// (Last-Event-ID). Callbacks: onEvent(envelope, type), onControl(type, data) for warning/dropped, onStatus(state,
// detail) with state one of connecting, live, retrying, unavailable (the server has no stream: 404), denied.
export function followEvents({url, headers, signal, onEvent, onControl = () => {}, onStatus = () => {}}) {
  let lastId = "";
  let backoff = 1000;
  async function once() {
    const parser = new SseParser();
    const decoder = new TextDecoder();
    const watchdog = new AbortController();
    const abortAll = () => watchdog.abort();
    signal.addEventListener("abort", abortAll, {once: true});
    let timer = setTimeout(abortAll, KEEPALIVE_TIMEOUT_MS);
    try {
      onStatus("connecting");
      const sendHeaders = {...headers(), Accept: "text/event-stream"};
      if (lastId) sendHeaders["Last-Event-ID"] = lastId;
      const response = await fetch(url, {headers: sendHeaders, signal: watchdog.signal, cache: "no-store"});
      if (response.status === 404) return "unavailable";
      if (response.status === 401 || response.status === 403) return "denied";
      if (!response.ok || !response.body) throw new Error(`HTTP ${response.status}`);
      onStatus("live");
      backoff = 1000;
      const reader = response.body.getReader();
      let slice = performance.now();
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        clearTimeout(timer);
        timer = setTimeout(abortAll, KEEPALIVE_TIMEOUT_MS);
        // A burst can arrive as one multi-megabyte chunk: parse it in slices and give the page the main thread
        // back whenever a slice has taken a few milliseconds, so a backlog never freezes it.
        const text = decoder.decode(value, {stream: true});
        for (let at = 0; at < text.length; at += SLICE_CHARS) {
          for (const message of parser.push(text.slice(at, at + SLICE_CHARS))) {
            if (message.kind !== "event") continue;
            if (message.id) lastId = message.id;
            if (message.type === "warning" || message.type === "dropped") {
              onControl(message.type, safeJson(message.data));
              continue;
            }
            const envelope = safeJson(message.data);
            if (envelope) onEvent(envelope, message.type);
          }
          if (performance.now() - slice > SLICE_MS) {
            await yieldToPage();
            slice = performance.now();
          }
        }
      }
      if (parser.retry !== null) backoff = Math.min(parser.retry, MAX_BACKOFF_MS);
      return "closed";
    } finally {
      clearTimeout(timer);
      signal.removeEventListener("abort", abortAll);
    }
  }
  (async () => {
    while (!signal.aborted) {
      let outcome;
      try {
        outcome = await once();
      } catch (error) {
        outcome = signal.aborted ? "aborted" : "error";
      }
      if (signal.aborted) return;
      if (outcome === "unavailable" || outcome === "denied") {
        onStatus(outcome);
        return;
      }
      onStatus("retrying", outcome);
      await sleep(backoff, signal);
      backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
    }
  })();
}

// Lets the browser paint and handle input: a message posted to a channel runs as a new task, without the 4 ms
// clamp of nested setTimeout(0).
function yieldToPage() {
  return new Promise((resolve) => {
    const channel = new MessageChannel();
    channel.port1.onmessage = () => resolve();
    channel.port2.postMessage(null);
  });
}

function safeJson(text) {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, {once: true});
  });
}
