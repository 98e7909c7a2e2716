"""The web console with client authentication and TLS on (docs/SECURITY.md), in a real headless
Chromium (as tests/integration/test_console.py) against a real secure local cluster (TLS on
every listener and link, node authentication, bearer tokens): without a token the console
loads and asks for one (401) instead of showing data; a token typed in the form, or given in
the URL fragment, is sent as ``Authorization: Bearer`` on every API call and kept in
sessionStorage (and out of the URL); a refused or revoked token brings the sign-in form back
with the node's reason; a principal without a grant sees 403 ACCESS and why.

The browser is told to accept the cluster's own CA-signed certificate
(``ignore_https_errors``): what is under test here is the console's handling of credentials;
TLS verification is tests/integration/test_security_tls.py's."""

from __future__ import annotations

import shutil
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from auth_support import SecureCluster, start_secure_cluster
from playwright.sync_api import Browser, BrowserContext, Page, Request, sync_playwright

from services import local_cluster as lc

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium")
PAGE_TIMEOUT_MS = 15_000
OUT_OF_RANGE_LOG = 101
"""The ``ranged`` principal of auth_support reads logs 1-100 only."""


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    cluster = start_secure_cluster(tmp_path_factory.mktemp("console-secure"), tls=True)
    try:
        yield cluster
    finally:
        lc.down(cluster.cluster.dir)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert CHROMIUM is not None, "chromium missing: run scripts/bootstrap.sh"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                              args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


class Console:
    """One browser tab (its own sessionStorage) on a secure node's console, with the API
    requests it made and any script error."""

    def __init__(self, browser: Browser, base: str) -> None:
        assert base.startswith("https://"), base
        self.base = base
        self.context: BrowserContext = browser.new_context(ignore_https_errors=True)
        self.page: Page = self.context.new_page()
        self.page.set_default_timeout(PAGE_TIMEOUT_MS)
        self.api_requests: list[tuple[str, str | None]] = []
        self.script_errors: list[str] = []
        self.page.on("request", self._on_request)
        self.page.on("pageerror", lambda e: self.script_errors.append(str(e)))

    def _on_request(self, request: Request) -> None:
        path = urllib.parse.urlsplit(request.url).path
        if path.startswith(("/v1/", "/ui/api/")):
            self.api_requests.append((path, request.headers.get("authorization")))

    def open(self, fragment: str) -> Page:
        self.page.goto(f"{self.base}/ui/{fragment}")
        self.page.wait_for_selector("body[data-ready='1']")
        return self.page

    def sign_in(self, token: str) -> None:
        self.page.fill("#token-input", token)
        self.page.click("#token-submit")

    def close(self) -> None:
        self.context.close()
        assert self.script_errors == [], self.script_errors


@pytest.fixture
def console(browser: Browser, secure: SecureCluster) -> Iterator[Console]:
    opened = Console(browser, secure.url)
    yield opened
    opened.close()


def test_without_a_token_the_console_asks_for_one_and_then_sends_it_everywhere(
        console: Console, secure: SecureCluster) -> None:
    page = console.open("#/cluster")
    assert page.is_visible("#token-form")
    assert "401" in page.inner_text("#auth-message")
    assert page.query_selector("#nodes") is None
    assert console.api_requests and all(a is None for _, a in console.api_requests)
    token = secure.tokens["admin"]
    console.api_requests.clear()
    console.sign_in(token)
    page.wait_for_selector("#nodes tbody tr")
    rows = page.eval_on_selector_all("#nodes tbody tr", "rows => rows.map(r => r.cells[0]"
                                     ".textContent)")
    assert sorted(rows) == sorted(n.node_id for n in secure.cluster.state.nodes)
    # The cluster-wide stats come from every node: the console's token reached its peers.
    page.wait_for_function("() => document.body.dataset.auth === 'token'")
    assert page.is_hidden("#banner"), page.inner_text("#banner")
    assert {p for p, _ in console.api_requests} >= {"/v1/cluster", "/ui/api/cluster-stats"}
    assert all(a == f"Bearer {token}" for _, a in console.api_requests), console.api_requests
    assert page.evaluate("sessionStorage.getItem('seqlog.token')") == token
    # A reload keeps the session (same tab); the logs page works with it too.
    console.open("#/logs")
    page.wait_for_selector("#logs")
    assert page.query_selector("#token-form") is None
    # Signing out forgets the token and asks again.
    page.click("#signout")
    page.wait_for_selector("#token-form")
    assert page.evaluate("sessionStorage.getItem('seqlog.token')") is None


def test_a_token_in_the_url_fragment_is_taken_and_removed_from_the_url(
        console: Console, secure: SecureCluster) -> None:
    token = secure.tokens["admin"]
    page = console.open(f"#/logs&token={urllib.parse.quote(token)}")
    page.wait_for_selector("#logs")
    assert page.evaluate("location.hash") == "#/logs"
    assert token not in page.url
    assert console.api_requests and all(a == f"Bearer {token}"
                                        for _, a in console.api_requests)


def test_a_refused_or_revoked_token_brings_the_sign_in_form_back_with_the_reason(
        console: Console, secure: SecureCluster) -> None:
    page = console.open("#/cluster")
    console.sign_in("not-a-token")
    page.wait_for_function("() => (document.querySelector('#auth-message') || {})"
                           ".textContent?.includes('refused')")
    assert "401 UNAUTHENTICATED" in page.inner_text("#auth-message")
    token = secure.token("admin", token_id="console-revoked")
    console.sign_in(token)
    page.wait_for_selector("#nodes tbody tr")
    secure.write_permissions(revoked=["console-revoked"])
    try:
        # The console polls every 2 s; the node re-reads the permissions file within its
        # reload interval: the form comes back on its own.
        page.wait_for_selector("#token-form", timeout=PAGE_TIMEOUT_MS)
        assert "revoked" in page.inner_text("#auth-message")
    finally:
        secure.write_permissions()


def test_a_principal_without_the_grant_sees_403_access(console: Console,
                                                       secure: SecureCluster) -> None:
    page = console.open(f"#/logs/{OUT_OF_RANGE_LOG}&token={secure.tokens['ranged']}")
    page.wait_for_selector("#banner:not([hidden])")
    banner = page.inner_text("#banner")
    assert "403 ACCESS" in banner, banner
    assert page.query_selector("#token-form") is None
    # The same token still shows what it may see.
    console.open("#/cluster")
    page.wait_for_selector("#nodes tbody tr")


def test_the_console_assets_load_without_a_token_and_hold_no_data(secure: SecureCluster,
                                                                  tmp_path: Path) -> None:
    """The shell is code from the package; every data route still needs a token (the full
    list is tests/integration/test_auth.py's)."""
    import ssl
    import urllib.error
    import urllib.request

    context = ssl.create_default_context(cafile=secure.cluster.state.ca_file)
    context.check_hostname = False
    for path, code in (("/ui/", 200), ("/ui/static/console.js", 200),
                       ("/ui/api/stats", 401), ("/v1/cluster", 401)):
        try:
            with urllib.request.urlopen(secure.url + path, context=context,
                                        timeout=10) as answer:
                got = answer.status
        except urllib.error.HTTPError as exc:
            got = exc.code
        assert got == code, (path, got)
