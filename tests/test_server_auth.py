"""Basic auth on every request, site isolation, and sessions bound to the site that opened them."""

from __future__ import annotations

import base64
import time
import uuid

import anyio
import httpx2
import pytest
from mcp.shared.exceptions import MCPError

import server.auth.basic as auth_module
from logstore.file.credentials import CredentialsFile
from server.auth.basic import Authenticator
from tests.helpers import initialize_body
from tests.server_support import MODES, call, connect, error_of, rpc_headers, serve

pytestmark = pytest.mark.anyio

PASSWORDS = {"alpha": "alpha-pw", "beta": "beta-pw"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("auth")
    creds = CredentialsFile(str(data_dir))
    for site, password in PASSWORDS.items():
        creds.add(site, password)
    with serve(data_dir, passwords=PASSWORDS) as running:
        yield running


def basic(site: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{site}:{password}".encode()).decode()


INIT = initialize_body(client="raw")


def recall_body(conversation_id: str, request_id: int = 2) -> dict:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "recall_memory", "arguments": {"conversation_id": conversation_id}},
    }


@pytest.mark.parametrize(
    ("authorization", "hint"),
    [
        (None, "Basic"),
        ("Bearer some-oauth-token", "Basic authentication"),
        ("bearer some-oauth-token", "Basic authentication"),
        (basic("alpha", "wrong"), "invalid"),
        (basic("nobody", "alpha-pw"), "invalid"),
        (basic("bad site!", "x"), "invalid"),
        ("Basic !!!not-base64!!!", "invalid"),
        ("Basic " + base64.b64encode(b"no-colon").decode(), "invalid"),
        ("Digest username=alpha", "Basic"),
    ],
)
async def test_requests_without_valid_basic_credentials_get_401(server, authorization, hint):
    headers = rpc_headers() | ({"Authorization": authorization} if authorization else {})
    async with httpx2.AsyncClient() as http:
        r = await http.post(server.url, json=INIT, headers=headers)
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith("Basic ")
    message = r.json()["error"]["message"]
    assert hint in message
    if authorization and authorization.lower().startswith("bearer"):
        assert "Bearer tokens are not accepted" in message


async def test_healthz_needs_no_credentials(server):
    async with httpx2.AsyncClient() as http:
        r = await http.get(f"{server.base}/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"


def leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in leaves(sub)]
    return [exc]


async def assert_rejected(url: str, site: str, password: str, mode: str) -> None:
    """The SDK reports an HTTP 401 as an MCPError (the raw tests above check the status itself)."""
    try:
        async with connect(url, site, password, mode) as client:
            await client.list_tools()
    except Exception as exc:  # inspected below
        assert any(isinstance(leaf, MCPError) for leaf in leaves(exc)), exc
    else:
        pytest.fail(f"{site} connected with password {password!r}")


@pytest.mark.parametrize("mode", MODES)
async def test_sdk_client_with_wrong_password_is_rejected(server, mode):
    await assert_rejected(server.url, "alpha", "not-the-password", mode)


@pytest.mark.parametrize("mode", MODES)
async def test_sites_are_isolated(server, mode):
    cid = f"shared-{uuid.uuid4().hex}"
    async with connect(server.url, "alpha", PASSWORDS["alpha"], mode) as a:
        assert not (await call(a, "append_memory", {"conversation_id": cid, "items": [{"secret": "alpha"}]}))[
            0
        ]
        async with connect(server.url, "beta", PASSWORDS["beta"], mode) as b:
            # Same id, other site: nothing to see, nothing listed.
            assert await call(b, "recall_memory", {"conversation_id": cid}) == (False, {"items": []})
            assert (await call(b, "replay_memory", {"conversation_id": cid, "limit": 10}))[1] == {"items": []}
            _, listing = await call(b, "list_conversations", {"limit": 1000})
            assert cid not in [s["conversation_id"] for s in listing["conversations"]]
            # Beta's conversation of the same name is its own log, starting at seq 0.
            _, ack = await call(b, "append_memory", {"conversation_id": cid, "items": [{"secret": "beta"}]})
            assert ack == {"first_seq": 0, "last_seq": 0}
        _, out = await call(a, "recall_memory", {"conversation_id": cid})
        assert [i["payload"] for i in out["items"]] == [{"secret": "alpha"}]
        _, listing = await call(a, "list_conversations", {"limit": 1000})
        assert cid in [s["conversation_id"] for s in listing["conversations"]]


async def test_session_cannot_be_used_with_another_sites_credentials(server):
    cid = f"hijack-{uuid.uuid4().hex}"
    async with connect(server.url, "alpha", PASSWORDS["alpha"], "legacy") as a:
        await call(a, "append_memory", {"conversation_id": cid, "items": [{"secret": "alpha"}]})

    async with httpx2.AsyncClient() as http:
        alpha = rpc_headers(("Authorization", basic("alpha", PASSWORDS["alpha"])))
        r = await http.post(server.url, json=INIT, headers=alpha)
        assert r.status_code == 200
        session = {"Mcp-Session-Id": r.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
        r = await http.post(
            server.url,
            json={"jsonrpc": "2.0", "method": "notifications/initialized"},
            headers=alpha | session,
        )
        assert r.status_code == 202

        # Beta presents alpha's session id: answered as if the session did not exist.
        beta = rpc_headers(("Authorization", basic("beta", PASSWORDS["beta"])))
        r = await http.post(server.url, json=recall_body(cid), headers=beta | session)
        assert r.status_code == 404
        assert "alpha" not in r.text
        # Without credentials the session id is worth nothing either.
        r = await http.post(server.url, json=recall_body(cid), headers=rpc_headers() | session)
        assert r.status_code == 401
        # The rightful owner's session still works and sees its data.
        r = await http.post(server.url, json=recall_body(cid, 3), headers=alpha | session)
        assert r.status_code == 200
        items = r.json()["result"]["structuredContent"]["items"]
        assert [i["payload"] for i in items] == [{"secret": "alpha"}]


async def _wait_for_status(url: str, authorization: str, status: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    async with httpx2.AsyncClient() as http:
        while True:
            r = await http.post(url, json=INIT, headers=rpc_headers(("Authorization", authorization)))
            if r.status_code == status:
                return
            assert time.monotonic() < deadline, f"still {r.status_code}, wanted {status}"
            await anyio.sleep(0.1)


async def test_site_changes_reach_a_running_server(server):
    """`site add` / `site remove` / `site passwd` take effect without a restart (within about a second)."""
    creds = CredentialsFile(server.data_dir)
    creds.add("gamma", "gamma-pw")
    await _wait_for_status(server.url, basic("gamma", "gamma-pw"), 200)
    creds.set_password("gamma", "gamma-pw-2")
    await _wait_for_status(server.url, basic("gamma", "gamma-pw"), 401)
    await _wait_for_status(server.url, basic("gamma", "gamma-pw-2"), 200)
    creds.remove("gamma")
    await _wait_for_status(server.url, basic("gamma", "gamma-pw-2"), 401)
    for mode in MODES:
        await assert_rejected(server.url, "gamma", "gamma-pw-2", mode)


# --- the authenticator itself (in-process) ----------------------------------------------------------


async def test_kdf_runs_once_per_credential_then_requests_are_cheap(tmp_path, monkeypatch):
    creds = CredentialsFile(str(tmp_path))
    creds.add("alpha", "alpha-pw")
    calls = []
    real_verify = auth_module.verify_password

    def counting_verify(entry, password):
        calls.append(password)
        return real_verify(entry, password)

    monkeypatch.setattr(auth_module, "verify_password", counting_verify)
    authenticator = Authenticator(creds)
    good = basic("alpha", "alpha-pw").encode()
    bad = basic("alpha", "nope").encode()

    assert (await authenticator.authenticate(good)).site == "alpha"
    assert await authenticator.authenticate(bad) is None
    start = time.perf_counter()
    for _ in range(1000):
        user = await authenticator.authenticate(good)
    per_request = (time.perf_counter() - start) / 1000
    assert user.site == "alpha" and user.access_token.client_id == "alpha"
    assert await authenticator.authenticate(bad) is None
    assert calls == ["alpha-pw", "nope"]  # one scrypt each, then the caches answer
    assert per_request < 200e-6, f"cached authentication took {per_request * 1e6:.0f} us"


async def test_concurrent_first_requests_share_one_kdf_run(tmp_path, monkeypatch):
    creds = CredentialsFile(str(tmp_path))
    creds.add("alpha", "alpha-pw")
    calls = []
    real_verify = auth_module.verify_password
    monkeypatch.setattr(auth_module, "verify_password", lambda e, pw: calls.append(pw) or real_verify(e, pw))
    authenticator = Authenticator(creds)
    results = []

    async def one() -> None:
        results.append(await authenticator.authenticate(basic("alpha", "alpha-pw").encode()))

    async with anyio.create_task_group() as tg:
        for _ in range(16):
            tg.start_soon(one)
    assert [u.site for u in results] == ["alpha"] * 16 and calls == ["alpha-pw"]


async def test_unknown_site_costs_a_kdf_run_too(tmp_path, monkeypatch):
    """No shortcut for unknown sites: their timing must not reveal which sites exist."""
    creds = CredentialsFile(str(tmp_path))
    creds.add("alpha", "alpha-pw")
    calls = []
    monkeypatch.setattr(auth_module, "verify_password", lambda entry, pw: calls.append(pw) or False)
    assert await Authenticator(creds).authenticate(basic("ghost", "pw").encode()) is None
    assert calls == ["pw"]


def test_error_body_of_401_is_json_and_names_basic(server):
    r = httpx2.post(server.url, json=INIT, headers=rpc_headers(("Authorization", "Bearer x")))
    assert r.status_code == 401 and error_of(r.json())["code"] == "Unauthorized"
