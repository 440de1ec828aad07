"""The package structure docs/ARCHITECTURE.md describes, checked: the server depends on logstore.core only,
no import cycles, no oversized modules, and the file engine conforms to the backend protocol."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("logstore", "server", "tools")
MAX_LINES = 450
# ConversationLog is split along its lock protocol (group_commit.py, seq_index.py, recovery.py, locking.py);
# what remains (state, refresh/poison, commit, reads) is the one module allowed over the bound, and only
# by what it has today: swapping in an immutable recovered state is the next step.
OVERSIZED: dict[str, int] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of ours that ``name`` imports anywhere (function-local imports included: a cycle hidden in
    a function is still a cycle), except under ``if TYPE_CHECKING`` and in a package's ``__getattr__``."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef) and child.name == "__getattr__" and is_package:
                continue  # a package's lazy attribute (``from logstore import Store``) runs on access only
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in child.names)
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in known and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph = {name: _imports(name, path, known) for name, path in modules.items()}
    # Importing a.b.c runs a/__init__ and a/b/__init__ first.
    for deps in graph.values():
        for dep in list(deps):
            parts = dep.split(".")
            deps.update(".".join(parts[:k]) for k in range(1, len(parts)) if ".".join(parts[:k]) in known)
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
    assert _cycles(_graph()) == []


def test_cycle_detector_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_server_depends_on_core_only() -> None:
    graph = _graph()
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
        if lines > OVERSIZED.get(rel, MAX_LINES):
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
    assert _file_layer_violations(_graph()) == []


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
    assert _server_layer_violations(_graph()) == []


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
