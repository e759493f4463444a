// The dashboard's shell: the login form (a bearer token, or none when the server runs --no-auth) or a sign-in link
// (#token=<token>), the hash router (#/, #/node/<name>, #/quotas[/<tree>], #/migrations[/<job>], #/watermarks) and
// the event stream's status in the header.
// Each page gets an AbortSignal that ends its requests, its event stream and its timers when the user leaves it.

import {probe, setToken, streamState, token, whenUnauthorized} from "./api.js";
import {h} from "./format.js";
import {migrationsPage} from "./migrations.js";
import {nodePage} from "./node.js";
import {overviewPage} from "./overview.js";
import {quotasPage} from "./quotas.js";
import {watermarksPage} from "./watermarks.js";

const ROUTES = [
  [/^#?\/?$/, overviewPage, "overview"],
  [/^#\/node\/(.+)$/, nodePage, "overview"],
  [/^#\/quotas(?:\/(.+))?$/, quotasPage, "quotas"],
  [/^#\/migrations(?:\/(.+))?$/, migrationsPage, "migrations"],
  [/^#\/watermarks$/, watermarksPage, "watermarks"],
];

const main = document.getElementById("main");
const status = document.getElementById("stream-status");
let current = null;

function route() {
  if (current) current.abort();
  current = new AbortController();
  const hash = location.hash || "#/";
  for (const [pattern, page, tab] of ROUTES) {
    const match = pattern.exec(hash);
    if (!match) continue;
    for (const link of document.querySelectorAll("nav a[data-tab]")) {
      link.classList.toggle("active", link.dataset.tab === tab);
    }
    const root = h("div", {class: "page", "data-page": page.name});
    main.replaceChildren(root);
    page(root, {signal: current.signal, params: match.slice(1).filter(Boolean).map(decodeURIComponent)});
    return;
  }
  main.replaceChildren(h("p", {class: "error"}, `no page at ${hash}`));
}

const STATUS_TEXT = {
  idle: "",
  connecting: "connecting to the event stream …",
  live: "live",
  retrying: "event stream lost; reconnecting …",
  unavailable: "no event stream on this server: refreshing every 15–30 s",
  denied: "the event stream refused the token",
};
streamState.listeners.add((state) => {
  status.textContent = STATUS_TEXT[state] ?? state;
  status.dataset.state = state;
  document.body.dataset.stream = state;
});

function showLogin(message) {
  if (current) current.abort();
  const input = h("input", {type: "password", id: "token", autocomplete: "off", placeholder: "API bearer token", size: 48});
  const problem = h("p", {class: "error", id: "login-error"}, message || "");
  const form = h("form", {class: "login", id: "login"},
    h("h1", {}, "koordbus"),
    h("p", {}, "Paste an API token (", h("code", {}, "koordbus up"), " writes an admin token to ",
      h("code", {}, ".koordbus/api-token"), "). It is kept in this tab only."),
    input, h("button", {type: "submit"}, "sign in"), problem);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const answer = await probe(input.value.trim());
    if (!answer.ok) {
      problem.textContent = answer.message;
      return;
    }
    setToken(input.value.trim());
    start();
  });
  main.replaceChildren(form);
  input.focus();
}

let started = false;
function start() {
  document.getElementById("sign-out").hidden = !token();
  if (!started) {
    started = true;
    window.addEventListener("hashchange", route);
  }
  route();
}

document.getElementById("sign-out").addEventListener("click", () => {
  setToken("");
  showLogin("signed out");
});
whenUnauthorized(() => {
  setToken("");
  showLogin("the server no longer accepts this token");
});

// A sign-in link (`koordbus up` prints one) carries the token in the URL fragment, which the browser never sends to
// the server: take it, and drop it from the address bar and the history at once.
function tokenFromLink() {
  const match = /^#token=([^&]*)$/.exec(location.hash);
  if (!match) return null;
  history.replaceState(null, "", `${location.pathname}${location.search}#/`);
  return decodeURIComponent(match[1]);
}

async function open() {
  const linked = tokenFromLink();
  if (linked !== null) {
    const answer = await probe(linked);
    if (!answer.ok) {
      showLogin(`the sign-in link's token was refused: ${answer.message}`);
      return;
    }
    setToken(linked);
  }
  // a stored token, or no token at all (a server with --no-auth)
  const answer = await probe(token());
  if (answer.ok) start();
  else showLogin(token() ? answer.message : "");
}

// a sign-in link opened in a tab that shows the dashboard already changes only the fragment: no new page load
window.addEventListener("hashchange", (event) => {
  if (location.hash.startsWith("#token=")) {
    event.stopImmediatePropagation();
    open();
  }
});
open();
