"""The package structure docs/ARCHITECTURE.md describes, checked: the server depends on logstore.core only,
no import cycles in any package (bench included), no oversized modules, and the file engine's layers."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("logstore", "server", "tools", "bench")
MAX_LINES = 450  # every module of PACKAGES, no exceptions


def _modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    out = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(name: str, path: Path, known: set[str], *, written: bool) -> set[str]:
    """Modules of ours that ``name`` imports. ``written``: every import statement in the file, under
    ``if TYPE_CHECKING``, in a function or in a package's ``__getattr__`` too (a cycle hidden there is
    still two modules that need each other). Otherwise what can run: function-local imports, but not
    those under ``if TYPE_CHECKING`` nor in a package's ``__getattr__``."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    statements: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef) and child.name == "__getattr__" and is_package:
                continue  # a package's lazy attribute (``from logstore import Store``) runs on access only
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                statements.append(child)
            visit(child)

    tree = ast.parse(path.read_text())
    if written:
        statements = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    else:
        visit(tree)
    found: set[str] = set()
    for statement in statements:
        if isinstance(statement, ast.Import):
            found.update(alias.name for alias in statement.names)
            continue
        base = statement.module or ""
        if statement.level:
            anchor = package.split(".")[: len(package.split(".")) - (statement.level - 1)]
            base = ".".join(anchor + ([base] if base else []))
        found.add(base)
        found.update(f"{base}.{alias.name}" for alias in statement.names)
    return {m for m in found if m in known and m != name}


def _graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES, *, written: bool) -> dict[str, set[str]]:
    """Module -> modules of ours it imports. ``written``: as the files say (the dependencies). Otherwise as
    they run, with the packages whose ``__init__`` an import runs first (importing a.b.c runs a/__init__
    and a/b/__init__): the two views are checked apart because a ``TYPE_CHECKING`` import of a package's
    re-export (``logstore`` -> ``file.store``) plus that implicit edge back is no cycle in either."""
    modules = _modules(root, packages)
    known = set(modules)
    graph = {name: _imports(name, path, known, written=written) for name, path in modules.items()}
    if not written:
        for name, deps in graph.items():
            for dep in list(deps):
                parts = dep.split(".")
                deps.update(".".join(parts[:k]) for k in range(1, len(parts)) if ".".join(parts[:k]) in known)
            deps.discard(name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in graph:
        if v not in index:
            strong(v)
    return out


def test_no_import_cycles() -> None:
    assert _cycles(_graph(written=True)) == []
    assert _cycles(_graph(written=False)) == []


def test_cycle_detector_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_cycle_check_sees_imports_hidden_in_functions_and_type_checking(tmp_path: Path) -> None:
    """The shapes of the two cycles this check was extended for (bench/appends <-> bench/procs,
    manifest/site <-> manifest/reconcile): one side imports at the top, the other only inside a function
    or only under ``if TYPE_CHECKING``."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .high import H\n"
    )
    (pkg / "high.py").write_text("from . import low\n\n\ndef run():\n    from pkg.worker import go\n")
    (pkg / "worker.py").write_text("from pkg.high import run\n")
    assert _cycles(_graph(tmp_path, ("pkg",), written=True)) == [["pkg.high", "pkg.low", "pkg.worker"]]
    # As they run, the TYPE_CHECKING side is gone: the function-local pair is still a cycle.
    assert _cycles(_graph(tmp_path, ("pkg",), written=False)) == [["pkg.high", "pkg.worker"]]


def test_server_depends_on_core_only() -> None:
    graph = _graph(written=True)
    for name, deps in graph.items():
        if name.startswith("server"):
            bad = {d for d in deps if d.startswith(("logstore.file", "logstore.fsck"))}
            assert not bad, f"{name} imports {sorted(bad)}"


def _engine_modules_after(imports: str) -> str:
    engine = "('logstore.file', 'logstore.fsck')"
    code = f"import sys\n{imports}\nprint(sorted(m for m in sys.modules if m.startswith({engine})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return out.stdout.strip()


def test_importing_the_server_loads_no_engine() -> None:
    assert _engine_modules_after("import server.http_app, server.runtime, server.mcp.app") == "[]"


def test_importing_errors_loads_no_engine() -> None:
    assert (
        _engine_modules_after("from logstore import InvalidArgument\nfrom logstore.core import errors")
        == "[]"
    )
    assert _engine_modules_after("from logstore import Store") != "[]"  # the probe does see the engine


def test_store_is_still_importable_from_the_package() -> None:
    from logstore import Store
    from logstore.file.store import Store as FileStore

    assert Store is FileStore


def test_no_oversized_modules() -> None:
    too_big = {}
    for path in _modules().values():
        rel = path.relative_to(ROOT).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            too_big[rel] = lines
    assert too_big == {}


# The file engine's layers (logstore/file/__init__.py and its sub-packages' docstrings): base modules,
# then the log, then the listing index, then what is built on both. Nothing imports a layer above its own.
_FILE_BASE = {f"logstore.file.{m}" for m in ("layout", "fileio", "statx", "locking", "boot")}
_FILE_LAYERS = (
    ("logstore.file.log", ("logstore.file.manifest",)),
    ("logstore.file.manifest", ()),
)
_FILE_TOP = {f"logstore.file.{m}" for m in ("store", "erasure", "credentials", "store_id")}


def _file_layer_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for name, deps in graph.items():
        if name in _FILE_BASE:
            above = [d for d in deps if d.startswith(("logstore.file.log", "logstore.file.manifest"))]
            above += [d for d in deps if d in _FILE_TOP]
            bad += [f"{name} -> {d}" for d in above]
        for layer, forbidden in _FILE_LAYERS:
            if name == layer or name.startswith(layer + "."):
                above = [d for d in deps if d.startswith(forbidden) or d in _FILE_TOP]
                bad += [f"{name} -> {d}" for d in above]
    return sorted(bad)


def test_file_engine_layers() -> None:
    assert _file_layer_violations(_graph(written=True)) == []


def test_file_layer_check_sees_an_upward_import() -> None:
    graph = {
        "logstore.file.log.conversation": {"logstore.file.manifest.site"},
        "logstore.file.fileio": {"logstore.file.store"},
        "logstore.file.manifest.site": {"logstore.file.log.conversation"},
    }
    assert _file_layer_violations(graph) == [
        "logstore.file.fileio -> logstore.file.store",
        "logstore.file.log.conversation -> logstore.file.manifest.site",
    ]


# The server's layers (server/__init__.py and its sub-packages' docstrings): transport at the bottom; auth and
# mcp on it, neither importing the other (mcp only the access log's ToolCall record); ui on those; the
# modules that compose them at the top. A sub-package may import what its entry lists (and the packages
# above those modules, whose __init__ runs first); a new flat module must be placed in a layer here.
_SERVER_LAYERS: dict[str, tuple[str, ...]] = {
    "server.transport": ("server.transport",),
    "server.auth": ("server.auth", "server.transport"),
    "server.mcp": ("server.mcp", "server.transport.access_log"),
    "server.ui": ("server.ui", "server.auth", "server.mcp", "server.transport"),
}
_SERVER_TOP = {"server", "server.config", "server.metrics", "server.http_app", "server.runtime"}


def _server_layer_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for name, deps in graph.items():
        if name != "server" and not name.startswith("server."):
            continue
        layer = next((p for p in _SERVER_LAYERS if name == p or name.startswith(p + ".")), None)
        if layer is None:
            if name not in _SERVER_TOP:
                bad.append(f"{name} is in no layer")
            continue
        allowed = _SERVER_LAYERS[layer]
        for dep in deps:
            if dep != "server" and not dep.startswith("server."):
                continue
            if not any(dep == a or dep.startswith(a + ".") or a.startswith(dep + ".") for a in allowed):
                bad.append(f"{name} -> {dep}")
    return sorted(bad)


def test_server_layers() -> None:
    assert _server_layer_violations(_graph(written=True)) == []


def test_server_layer_check_sees_an_upward_import() -> None:
    graph = {
        "server.auth.basic": {"server", "server.transport", "server.transport.http_limits", "server.mcp.app"},
        "server.mcp.app": {"server.transport", "server.transport.access_log", "server.transport.workers"},
        "server.transport.http_limits": {"server.config", "logstore.core.limits"},
        "server.ui.app": {"server.auth.basic", "server.mcp.tool_errors", "server.http_app"},
        "server.flat": set(),
        "server.runtime": {"server.http_app", "server.transport.workers"},
    }
    assert _server_layer_violations(graph) == [
        "server.auth.basic -> server.mcp.app",
        "server.flat is in no layer",
        "server.mcp.app -> server.transport.workers",
        "server.transport.http_limits -> server.config",
        "server.ui.app -> server.http_app",
    ]
