// Signing in through the OpenID Connect provider that `GET /api/signin` names, if any: the
// authorization code flow with PKCE, as a public client, done by oidc-client-ts (vendored in
// web/vendor/, loaded only when a provider is configured), never by hand. The provider's access
// token then serves as the page's key: kept for the tab and sent as `Authorization: Bearer`, like
// a key typed in the dialog; when it expires, the API's 401 brings the dialog back.

const LIBRARY = "/web/vendor/oidc-client-ts/oidc-client-ts.min.js";
let provider = null; // the promise of {manager, host}, or of null (keys only)

function load(src) {
  return new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = src;
    script.onload = resolve;
    script.onerror = () => reject(new Error(`${src} did not load`));
    document.head.append(script);
  });
}

async function configured() {
  const response = await fetch("/api/signin", { headers: { Accept: "application/json" } });
  const body = response.ok ? await response.json() : {};
  if (!body.oidc) return null;
  if (!globalThis.oidc) await load(LIBRARY);
  const { UserManager, WebStorageStateStore } = globalThis.oidc;
  const manager = new UserManager({
    authority: body.oidc.issuer,
    client_id: body.oidc.clientId,
    redirect_uri: `${location.origin}/`,
    response_type: "code", // PKCE is the library's default for the code flow
    scope: body.oidc.scope,
    userStore: new WebStorageStateStore({ store: sessionStorage }),
    automaticSilentRenew: false,
  });
  return { manager, host: new URL(body.oidc.issuer).host };
}

function providerOf() {
  if (provider === null) provider = configured().catch(() => null);
  return provider;
}

/** The provider's host, to name on the sign-in button; null when the page signs in with keys only. */
export async function offered() {
  const p = await providerOf();
  return p && p.host;
}

/** Leave for the provider's sign-in; it sends the browser back to `/` with a code. */
export async function signInThroughProvider() {
  const p = await providerOf();
  if (p) await p.manager.signinRedirect();
}

/**
 * Back from the provider (`/?code=…&state=…`, or `?error=…`): exchange the code for tokens and
 * return the access token; null when the address holds no answer of a provider's. The address is
 * cleaned either way. Rejects with the provider's or the library's reason.
 */
export async function completeSignIn() {
  const params = new URLSearchParams(location.search);
  if (!params.has("state") || !(params.has("code") || params.has("error"))) return null;
  const answer = location.href;
  history.replaceState(null, "", `/${location.hash}`);
  const p = await providerOf();
  if (!p) return null;
  const user = await p.manager.signinRedirectCallback(answer);
  return user.access_token;
}

/** Forget what the library kept for this tab (the signed-in user, any sign-in under way). */
export function forgetProvider() {
  for (const key of Object.keys(sessionStorage)) {
    if (key.startsWith("oidc.")) sessionStorage.removeItem(key);
  }
}
