"""The installable distribution is ``logstore-memory`` (issue 36 §4: ``logstore`` on the package index is
another project, and installing its postgres extra there fails with 'does not provide the extra'):
the installed metadata answers to that name, the version the CLI and the server report comes from it, and
no install command in the docs or in a message names the other project."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata

from logstore.core.distribution import DISTRIBUTION, version
from server.mcp.app import server_version
from tests.server_support import REPO
from tools.cli import package_version


def test_the_project_installs_as_logstore_memory_and_reports_its_version():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION == "logstore-memory"
    assert metadata.version(DISTRIBUTION) == project["version"]  # installed under that name (make test)
    assert package_version() == server_version() == version("none") == project["version"]
    # Every self-reference in the extras names the distribution, never the unrelated 'logstore'.
    extras = " ".join(d for deps in project["optional-dependencies"].values() for d in deps)
    assert "logstore[" not in extras and f"{DISTRIBUTION}[postgres]" in extras


def test_no_install_command_names_the_unrelated_package():
    texts = [p for p in REPO.rglob("*") if p.suffix in (".md", ".py") and ".venv" not in p.parts]
    wrong = re.compile(r"pip install (-e )?'?logstore(\[|'| |$)")
    found = [
        f"{p.relative_to(REPO)}: {line.strip()}"
        for p in texts
        if "node_modules" not in p.parts
        for line in p.read_text(encoding="utf-8", errors="replace").splitlines()
        if wrong.search(line)
    ]
    assert not found, found
