// The dashboard's calls to the REST API: the bearer token (typed into the login form, kept in sessionStorage so
// it goes with the tab), JSON fetches that turn the API's {"error": ...} bodies into exceptions, and the event
// stream with the same token.

import {followEvents} from "./sse.js";

const TOKEN_KEY = "koordbus.token";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

export function authHeaders() {
  const t = token();
  return t ? {Authorization: `Bearer ${t}`} : {};
}

let onUnauthorized = () => {};
export function whenUnauthorized(callback) {
  onUnauthorized = callback;
}

export async function api(path, {method = "GET", body, signal} = {}) {
  const headers = {...authHeaders()};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
    cache: "no-store",
  });
  const text = await response.text();
  let parsed = null;
  try {
    parsed = text ? JSON.parse(text) : null;
  } catch {
    parsed = null;
  }
  if (!response.ok) {
    if (response.status === 401) onUnauthorized();
    const message = parsed && parsed.error ? parsed.error : `HTTP ${response.status} on ${path}`;
    throw new ApiError(response.status, message);
  }
  return parsed;
}

// Checks a token (or none: a server started with --no-auth) with the cheapest authenticated read.
export async function probe(candidate) {
  const headers = candidate ? {Authorization: `Bearer ${candidate}`} : {};
  const response = await fetch("/api/v1/quota-trees", {headers, cache: "no-store"});
  if (response.ok) return {ok: true};
  let message = `HTTP ${response.status}`;
  try {
    message = (await response.json()).error || message;
  } catch {
    /* keep the status */
  }
  return {ok: false, status: response.status, message};
}

// The event stream's status, shown in the header; pages fall back to polling while it is not live.
export const streamState = {state: "idle", listeners: new Set()};
function setStreamState(state) {
  streamState.state = state;
  for (const listener of streamState.listeners) listener(state);
}

// Follows /api/v1/events/stream with `filters` ({type: [...], node, quota, tree, ...}) until `signal` aborts.
export function events(filters, signal, onEvent, onControl) {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(filters)) {
    if (value === undefined || value === null || value === "") continue;
    params.set(key, Array.isArray(value) ? value.join(",") : String(value));
  }
  followEvents({
    url: `/api/v1/events/stream?${params}`,
    headers: authHeaders,
    signal,
    onEvent,
    onControl: onControl || ((type, data) => console.warn("event stream", type, data)),
    onStatus: (state) => setStreamState(state),
  });
}
