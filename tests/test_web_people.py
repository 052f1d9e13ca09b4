"""Who is signed in, in Debian's Chromium against the real API and worker (docs/web.md "Signing in").

Users' keys are made and revoked with ``sophos users`` as an operator would, while the page is
open. The browser, the offline context and the service come from tests/support/browser.py.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from tests.fakes.ollama import FakeOllama, Hang, Text
from tests.support.browser import Offline, Page, expect, send
from tests.support.client import chat, get_json, wait_for
from tests.support.env import SophosEnv
from tests.support.oidc import Issuer
from tests.support.users import add_user, users


def sign_in(page: Page, key: str) -> None:
    dialog = page.locator("#token-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.get_by_role("heading")).to_have_text("Sign in")
    page.get_by_role("textbox", name="Key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    expect(dialog).to_be_hidden()


def refused(url: str, key: str) -> bool:
    answer = httpx.get(f"{url}/api/whoami", headers={"authorization": f"Bearer {key}"}, timeout=10)
    return answer.status_code == 401


def listed(page: Page, conversation: str) -> object:
    return page.locator(f'#conversations li[data-id="{conversation}"]')


def test_without_identities_the_page_shows_the_local_user(
    service: Callable[..., str], offline: Offline
) -> None:
    page = offline.open(service())
    expect(page.locator("#account-name")).to_have_text("local")
    expect(page.locator("#account-role")).to_have_text("operator")  # the local user is one
    expect(page.get_by_role("button", name="Sign out")).to_be_hidden()
    expect(page.locator("#token-dialog")).to_be_hidden()


def test_people_sign_in_and_out_see_their_own_and_a_revoked_key_is_asked_again(
    sophos_env: SophosEnv, service: Callable[..., str], offline: Offline, model: FakeOllama
) -> None:
    alice = add_user(sophos_env, "alice")
    bob = add_user(sophos_env, "bob")
    model.script(Text("For Alice."), Text("For Bob."))
    url = service()
    alices, _ = chat(url, "alice's secret plan", token=alice)
    bobs, _ = chat(url, "bob's shopping list", token=bob)

    page = offline.open(url)
    sign_in(page, alice)
    expect(page.locator("#account-name")).to_have_text("alice")
    expect(page.locator("#account-role")).to_be_hidden()  # a user, not an operator
    expect(listed(page, alices)).to_be_visible()
    expect(listed(page, bobs)).to_have_count(0)
    # At 375 px too, the name and Sign out are in the header, which fits the screen.
    page.set_viewport_size({"width": 375, "height": 740})
    expect(page.locator("#account-name")).to_be_in_viewport()
    expect(page.get_by_role("button", name="Sign out")).to_be_in_viewport()
    assert page.evaluate("document.documentElement.scrollWidth <= innerWidth")
    page.set_viewport_size({"width": 1100, "height": 760})

    # Sign out forgets the key and asks again; the next person sees only their own.
    page.get_by_role("button", name="Sign out").click()
    expect(page.locator("#token-dialog")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('sophos.token')") is None
    expect(page.locator("#account-name")).not_to_have_text("alice")
    sign_in(page, bob)
    expect(page.locator("#account-name")).to_have_text("bob")
    expect(listed(page, bobs)).to_be_visible()
    expect(listed(page, alices)).to_have_count(0)
    expect(page.locator("#conversations li")).to_have_count(1)

    # A key that is not one is refused in the dialog, which stays open.
    page.get_by_role("button", name="Sign out").click()
    page.get_by_role("textbox", name="Key").fill("sk-sophos-not-a-key")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#token-error")).to_contain_text("the key is not valid (unknown, or revoked)")
    sign_in(page, bob)
    expect(listed(page, bobs)).to_be_visible()

    # Bob's key revoked while the page is open: the next request asks for a key, saying why.
    assert users(sophos_env, "revoke", "bob").returncode == 0
    wait_for(lambda: refused(url, bob), timeout=5, message="bob's key refused")
    send(page, "one more thing")
    expect(page.locator("#token-dialog")).to_be_visible()
    expect(page.locator("#token-error")).to_contain_text(
        "the key is not valid (unknown, or revoked): sign in again"
    )
    # Someone else signing in gets a fresh page: Bob's message is not sent as Alice's.
    sign_in(page, alice)
    expect(page.locator("#account-name")).to_have_text("alice")
    expect(listed(page, alices)).to_be_visible()
    expect(listed(page, bobs)).to_have_count(0)
    titles = [c["title"] for c in get_json(url, "/api/conversations", token=alice)["conversations"]]
    assert titles == ["alice's secret plan"]


def test_the_page_signs_in_through_the_identity_provider_with_pkce_and_signs_out(
    sophos_env: SophosEnv, service: Callable[..., str], offline: Offline, model: FakeOllama
) -> None:
    """The authorization code flow with PKCE, as a public client, against a provider on loopback
    (tests/support/oidc.py): the page leaves for the provider, comes back with a code, exchanges
    it (the provider checks the verifier), and the access token is the page's key."""
    model.script(Text("Hello, Carol."))
    with Issuer(audience="sophos") as issuer:
        issuer.login_as = "carol"
        url = service(AUTH_OIDC_ISSUER=issuer.url, AUTH_OIDC_AUDIENCE="sophos",
                      AUTH_OIDC_PAGE_CLIENT="sophos-page")
        csp = httpx.get(url, timeout=10).headers["content-security-policy"]
        assert f"connect-src 'self' {issuer.url}" in csp  # the page may reach its provider, nothing else

        page = offline.open(url)
        dialog = page.locator("#token-dialog")
        expect(dialog).to_be_visible()
        provider = page.get_by_role("button", name=f"Sign in with {issuer.url.removeprefix('http://')}")
        provider.click()
        expect(page.locator("#account-name")).to_have_text("carol")
        expect(dialog).to_be_hidden()
        assert "code=" not in page.url and "state=" not in page.url  # the answer is not left in the address
        asked = issuer.codes == {} and issuer.refused == []
        assert asked, (issuer.codes, issuer.refused)  # the one code was exchanged, with the verifier

        send(page, "hello")
        expect(page.locator(".message.assistant").last).to_contain_text("Hello, Carol.")
        conversations = get_json(url, "/api/conversations", token=issuer.token("carol"))["conversations"]
        assert len(conversations) == 1  # hers, asked with her own token

        page.get_by_role("button", name="Sign out").click()
        expect(dialog).to_be_visible()
        expect(provider).to_be_visible()
        assert page.evaluate("Object.keys(sessionStorage)") == []  # nothing of carol's kept


def test_the_runs_view_says_whose_each_run_is_and_who_started_or_cancelled_it(
    sophos_env: SophosEnv, service: Callable[..., str], offline: Offline, model: FakeOllama
) -> None:
    alice = add_user(sophos_env, "alice")
    root = add_user(sophos_env, "root", "--operator")
    hold = Hang()
    model.script(hold, Text("Picked up by root."))
    url = service()
    conversation, run = chat(url, "alice's long question", token=alice)
    hold.wait_started()
    cancelled = httpx.post(f"{url}/api/runs/{run}/cancel", headers={"authorization": f"Bearer {root}"},
                           timeout=10)
    assert cancelled.status_code in (200, 202), cancelled.text
    def status(run_id: str) -> str:
        return str(get_json(url, f"/api/runs/{run_id}", token=alice)["status"])

    wait_for(lambda: status(run) == "cancelled", message="cancelled")
    _, again = chat(url, "go on", conversation, token=root)  # an operator continues alice's conversation
    wait_for(lambda: status(again) == "completed", message="done")

    page = offline.open(f"{url}/#/runs")
    sign_in(page, root)
    expect(page.locator(f'#runs-finished tr[data-run="{run}"] .who')).to_have_text("alice, cancelled by root")
    expect(page.locator(f'#runs-finished tr[data-run="{again}"] .who')).to_have_text("alice, started by root")
