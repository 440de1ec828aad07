"""The ``logstore`` CLI: ``site`` management, ``serve``'s first-run quickstart, env vars, workers, stdio."""

from __future__ import annotations

import os
import re
import shutil
import ssl
import subprocess
import uuid

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from logstore import Store
from logstore.core.registry import verify_password
from logstore.file.credentials import CredentialsFile
from tests.helpers import initialize_body
from tests.server_support import MODES, REPO, call, connect, free_port, logstore_cmd, serve, wait_healthy
from tools.serve import SNIPPET_BEGIN, SNIPPET_END

pytestmark = pytest.mark.anyio


def logstore(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*logstore_cmd(), *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


def test_site_add_list_passwd_remove(tmp_path):
    d = str(tmp_path / "data")
    added = logstore("site", "add", "alpha", "--data-dir", d)
    assert added.returncode == 0, added.stderr
    password = added.stdout.splitlines()[-1]
    assert re.fullmatch(r"[A-Za-z0-9_-]{32}", password)  # alone on the last line
    assert verify_password(CredentialsFile(d).load()["alpha"], password)

    beta = logstore("site", "add", "beta", "--password-stdin", "--data-dir", d, stdin="chosen password\n")
    assert beta.returncode == 0 and "chosen password" not in beta.stdout
    assert verify_password(CredentialsFile(d).load()["beta"], "chosen password")

    assert logstore("site", "add", "alpha", "--data-dir", d).returncode == 1  # exists
    bad = logstore("site", "add", "no such/site", "--data-dir", d)
    assert bad.returncode == 2 and "[A-Za-z0-9_-]" in bad.stderr
    assert logstore("site", "add", "gamma", "--password-stdin", "--data-dir", d, stdin="\n").returncode == 2

    # The data dir can come from the environment, like every serve setting.
    assert logstore("site", "list", env={"LOGSTORE_DATA_DIR": d}).stdout.split() == ["alpha", "beta"]

    new = logstore("site", "passwd", "alpha", "--data-dir", d)
    assert new.returncode == 0
    entry = CredentialsFile(d).load()["alpha"]
    assert verify_password(entry, new.stdout.splitlines()[-1]) and not verify_password(entry, password)

    assert logstore("site", "remove", "beta", "--data-dir", d).returncode == 0
    assert logstore("site", "remove", "beta", "--data-dir", d).returncode == 1
    assert logstore("site", "list", "--data-dir", d).stdout.split() == ["alpha"]
    assert oct(os.stat(os.path.join(d, "credentials.json")).st_mode & 0o777) == "0o600"


def test_first_serve_creates_local_and_prints_working_config_once(tmp_path):
    data_dir = tmp_path / "fresh"
    with serve(data_dir) as server:
        out = server.stdout()
        assert CredentialsFile(str(data_dir)).sites() == ["local"]
        header = re.search(r"HTTP header:\s+(Authorization: Basic \S+)", out).group(1)
        assert f'claude mcp add --transport http logstore {server.url} --header "{header}"' in out
        # The printed header works as-is.
        r = httpx2.post(
            server.url,
            headers={
                "Authorization": header.split(": ", 1)[1],
                "Accept": "application/json, text/event-stream",
            },
            json=initialize_body(),
        )
        assert r.status_code == 200
        # And so does the printed Python snippet, run exactly as printed (marker lines included: they
        # are comments), with the interpreter the banner names.
        snippet = out[out.index(SNIPPET_BEGIN) : out.index(SNIPPET_END) + len(SNIPPET_END)]
        python = re.search(r"run `(\S+) demo.py`", out).group(1)
        ran = subprocess.run([python, "-c", snippet], capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.splitlines()[0] == "{'first_seq': 0, 'last_seq': 0}"
        assert "'text': 'hi'" in ran.stdout
    password = re.search(r"Site/password:\s+local / (\S+)", out).group(1)
    with serve(data_dir) as again:
        second = again.stdout()
    assert password not in second and "Authorization" not in second
    assert again.url in second and "local" in second


def test_serve_reads_settings_from_the_environment(tmp_path):
    data_dir = str(tmp_path / "envdir")
    CredentialsFile(data_dir).add("alpha", "pw")
    port = free_port()
    env = {
        **os.environ,
        "LOGSTORE_DATA_DIR": data_dir,
        "LOGSTORE_PORT": str(port),
        "LOGSTORE_LOG_LEVEL": "warning",
    }
    proc = subprocess.Popen([*logstore_cmd(), "serve"], cwd=REPO, env=env, stdout=subprocess.DEVNULL)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize(
    "args",
    [
        ["--workers", "0"],
        ["--ssl-certfile", "cert.pem"],
        ["--port", "70000"],
        ["--stdio", "--site", "bad site"],
    ],
)
def test_serve_rejects_bad_settings(tmp_path, args):
    result = logstore("serve", "--data-dir", str(tmp_path), *args)
    assert result.returncode == 2 and result.stderr.startswith("logstore serve:")


async def test_several_workers_share_one_data_dir(tmp_path):
    data_dir = tmp_path / "workers"
    CredentialsFile(str(data_dir)).add("alpha", "pw")
    cid = f"workers-{uuid.uuid4().hex}"
    with serve(data_dir, "--workers", "2") as server:
        for mode in MODES:
            for _ in range(3):  # new connections, so both worker processes get traffic
                async with connect(server.url, "alpha", "pw", mode) as c:
                    for _ in range(3):
                        assert not (
                            await call(c, "append_memory", {"conversation_id": cid, "items": [{}, {}]})
                        )[0]
        async with connect(server.url, "alpha", "pw", "legacy") as c:
            _, out = await call(c, "replay_memory", {"conversation_id": cid, "limit": 1000})
    assert [i["seq"] for i in out["items"]] == list(range(36))  # gapless across processes


@pytest.mark.parametrize("mode", MODES)
async def test_stdio_mode(tmp_path, mode):
    data_dir = str(tmp_path / "stdio")
    # Both ways to name the store, one per protocol era: --data-dir D is shorthand for --store file:D.
    where = ["--data-dir", data_dir] if mode == MODES[0] else ["--store", f"file:{data_dir}"]
    params = StdioServerParameters(
        command=logstore_cmd()[0],
        args=[*logstore_cmd()[1:], "serve", "--stdio", *where, "--site", "alpha"],
        cwd=str(REPO),
    )
    async with Client(params, mode=mode) as client:
        assert [t.name for t in (await client.list_tools()).tools][0] == "append_memory"
        assert await call(
            client, "append_memory", {"conversation_id": "stdio-conv-1", "items": [{"x": 1}]}
        ) == (
            False,
            {"first_seq": 0, "last_seq": 0},
        )
        is_error, out = await call(client, "append_memory", {"conversation_id": "bad", "items": [{}]})
        assert is_error and out["error"]["code"] == "InvalidConversationId"
    with Store(data_dir) as store:  # written as site alpha, to the data dir
        assert [m.payload for m in store.recall("alpha", "stdio-conv-1")] == [{"x": 1}]


@pytest.mark.skipif(
    shutil.which("openssl") is None, reason="openssl not installed: cannot make a test certificate"
)
async def test_tls(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    data_dir = tmp_path / "tls"
    CredentialsFile(str(data_dir)).add("alpha", "pw")
    port = free_port()
    proc = subprocess.Popen(
        [*logstore_cmd(), "serve", "--data-dir", str(data_dir), "--port", str(port)]
        + ["--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--log-level", "warning"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    trust = ssl.create_default_context(cafile=str(cert))
    try:
        url = f"https://127.0.0.1:{port}/mcp"
        for _ in range(400):
            try:
                assert httpx2.get(f"https://127.0.0.1:{port}/healthz", verify=trust).status_code == 200
                break
            except httpx2.HTTPError:
                await anyio.sleep(0.05)
        async with httpx2.AsyncClient(auth=httpx2.BasicAuth("alpha", "pw"), verify=trust) as http:
            async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
                assert not (await call(client, "recall_memory", {"conversation_id": "tls-conv-1"}))[0]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
