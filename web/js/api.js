// Talking to the API: JSON requests, the error envelope, the key of whoever is signed in.
//
// The page is served by the API itself (same origin), so no CORS is involved. Once the API
// knows identities (a user's key, API_TOKEN, an OIDC provider), any 401 asks for a key, or to
// sign in through the provider (signin.js): at first, and again when the credential stops
// working (revoked, expired). It is kept for the tab in sessionStorage and sent as
// `Authorization: Bearer` (and as `access_token` on URLs that a browser requests by itself:
// EventSource, download links).

import { forgetProvider, offered, signInThroughProvider } from "./signin.js";

const TOKEN_KEY = "sophos.token";

/** An answer in the API's `{error: {code, message}}` envelope, or no answer at all. */
export class ApiError extends Error {
  constructor(status, code, message, body = null) {
    super(message);
    this.status = status;
    this.code = code;
    this.body = body;
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

let asking = null;
let signedIn = null; // the name `GET /api/whoami` last gave
const SIGNED_IN = "sophos:signed-in";

/** Who the page acts as (`{name, operator, via}`); remembered to notice a change of person. */
export async function whoami() {
  const me = await api("/api/whoami");
  signedIn = me.name;
  return me;
}

/** Call `listener(me)` each time someone signs in through the dialog. */
export function onSignIn(listener) {
  window.addEventListener(SIGNED_IN, (event) => listener(event.detail));
}

/** Forget the key and load the page afresh: nothing of this person's stays on screen. */
export function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  forgetProvider();
  location.replace("/");
}

/** Keep the access token the provider gave (signin.js) as this tab's key. */
export function keepToken(value) {
  sessionStorage.setItem(TOKEN_KEY, value);
}

/**
 * The key typed in the dialog, checked with `GET /api/whoami` before anything is sent with it:
 * `{me}`, or `{error}` to show in the dialog.
 */
async function check(value) {
  sessionStorage.setItem(TOKEN_KEY, value);
  const response = await send("/api/whoami", {}).catch((error) => error);
  if (response instanceof Response && response.ok) return { me: await response.json() };
  sessionStorage.removeItem(TOKEN_KEY);
  if (!(response instanceof Response)) return { error: response.message };
  const data = await response.json().catch(() => null);
  return { error: (data && data.error && data.error.message) || `HTTP ${response.status}` };
}

/** Show the sign-in dialog (once for all callers waiting at the same time). */
export function askForToken(reason) {
  if (asking) return asking;
  const dialog = document.getElementById("token-dialog");
  const form = document.getElementById("token-form");
  const input = document.getElementById("token");
  document.getElementById("token-error").textContent = reason || "";
  const providerButton = document.getElementById("provider-sign-in");
  offered().then((host) => {
    document.getElementById("provider-name").textContent = host || "";
    document.getElementById("provider-choice").hidden = !host;
  });
  providerButton.onclick = () => {
    signInThroughProvider().catch((error) => {
      document.getElementById("token-error").textContent = `${error.message}: try again.`;
    });
  };
  asking = new Promise((resolve) => {
    const submit = async (event) => {
      event.preventDefault();
      const value = input.value.trim();
      if (!value) return;
      const { me, error } = await check(value);
      if (error) {
        document.getElementById("token-error").textContent = `${error}: try again.`;
        return;
      }
      if (signedIn !== null && me.name !== signedIn) {
        // Someone else: what waits was asked as the last person, and what shows is theirs.
        location.replace("/");
        return;
      }
      signedIn = me.name;
      window.dispatchEvent(new CustomEvent(SIGNED_IN, { detail: me }));
      form.removeEventListener("submit", submit);
      dialog.close();
      input.value = "";
      asking = null;
      resolve();
    };
    form.addEventListener("submit", submit);
    // Escape would leave the page without a way to retry: keep the dialog open.
    dialog.addEventListener("cancel", (event) => event.preventDefault(), { once: true });
    dialog.showModal();
    input.focus();
  });
  return asking;
}

/** `url` with the token as `access_token`, for requests the browser makes by itself. */
export function withToken(url) {
  const t = token();
  if (!t) return url;
  const u = new URL(url, location.origin);
  u.searchParams.set("access_token", t);
  return u.pathname + u.search;
}

async function send(path, { method = "GET", body, accept = "application/json" }) {
  const headers = { Accept: accept };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  try {
    return await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (error) {
    throw new ApiError(0, "NETWORK_ERROR", `the API cannot be reached (${error.message})`);
  }
}

/**
 * Call the API; resolve with the parsed JSON (null for 204, the text when `text` is set);
 * reject with an ApiError carrying the API's own code and message.
 */
export async function api(path, { method = "GET", body, text = false } = {}) {
  for (;;) {
    const response = await send(path, { method, body, accept: text ? "*/*" : "application/json" });
    const raw = response.status === 204 ? "" : await response.text();
    let data = null;
    try {
      data = raw && !text ? JSON.parse(raw) : null;
    } catch {
      data = null;
    }
    if (response.status === 401) {
      const message = (data && data.error && data.error.message) || "a key is required";
      // With a key kept, it stopped working (revoked, or the API's token changed): say why.
      await askForToken(token() ? `${message}: sign in again.` : "");
      continue;
    }
    if (!response.ok) {
      let error = data && data.error;
      if (!error && raw.trim().startsWith("{")) {
        try {
          error = JSON.parse(raw).error;
        } catch {
          error = null;
        }
      }
      throw new ApiError(
        response.status,
        (error && error.code) || `HTTP_${response.status}`,
        (error && error.message) || raw.slice(0, 300) || response.statusText,
        data,
      );
    }
    if (response.status === 204) return null;
    return text ? raw : data;
  }
}
