// Who the service takes this browser for, shown in the page's header; where reads need a
// token, a box that asks for it once (kept for the browser session).

import { ApiError, storeToken, whoami } from "./api.js";
import { el } from "./dom.js";

// The roles that may change a run (app/middleware/roles.py).
const WRITERS = new Set(["operator", "admin"]);

export function canWrite(who) {
  return !who || who.role === null || WRITERS.has(who.role);
}

function signInBox() {
  const input = el("input", { id: "signin-token", type: "password", autocomplete: "off" });
  const form = el(
    "form",
    { id: "signin", class: "signin" },
    el("label", { for: "signin-token", text: "Access token" }),
    input,
    el("button", { type: "submit", text: "Sign in" }),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    storeToken(input.value.trim());
    window.location.reload();
  });
  return form;
}

// What the header says of ``who``: a name and a role, or that nobody signed in.
export function identityLabel(who) {
  return who && who.name ? `${who.name} · ${who.role}` : "anonymous · read-only";
}

function showWho(who) {
  let node = document.getElementById("whoami");
  if (!node) {
    node = el("span", { id: "whoami", class: "whoami" });
    document.querySelector("header.top").append(node);
  }
  node.textContent = identityLabel(who);
  node.dataset.role = who.role || "";
  document.body.dataset.role = who.role || "";
}

// Ask again, after the page kept or forgot a token: the header said "anonymous" after a
// token was accepted and a change sent with it.
export async function refreshIdentity() {
  const who = await whoami();
  showWho(who);
  return who;
}

// {name, role, source, reads_open}, or null where the service wants a token first (the
// sign-in box then shows).
export async function showIdentity() {
  const header = document.querySelector("header.top");
  let who;
  try {
    who = await whoami();
  } catch (error) {
    if (!(error instanceof ApiError) || error.status !== 401) throw error;
    storeToken("");
    header.append(signInBox());
    return null;
  }
  showWho(who);
  return who;
}
