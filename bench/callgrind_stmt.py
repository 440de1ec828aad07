"""Instructions per execution of one Python statement, from callgrind: counts that do not move with the
machine's load (the figures behind the engine's small choices in docs/PERFORMANCE.md).

    python -m bench.callgrind_stmt --tree . --setup 'from bench.config import make_items
    from logstore.core.batch import prepare_batch
    items = make_items(10, 200)' 'prepare_batch(items)'

The statement runs ``--small`` and ``--large`` times in a loop inside a function, each count in a fresh
process under ``valgrind --tool=callgrind`` (``PYTHONPATH`` the tree's, ``PYTHONHASHSEED=0``); (Ir of large
- Ir of small) / (large - small) is user-space instructions per execution, the start, the imports and
``--setup`` cancelled.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

__all__ = ["instructions", "main"]

_CHILD = """
import sys
{setup}
_n = int(sys.argv[1])
def _run():
    for _ in range(_n):
        {stmt}
_run()
"""


def _ir(tree: str, child: str, count: int) -> int:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree), "PYTHONHASHSEED": "0"}
    with tempfile.TemporaryDirectory(prefix="cg-stmt-") as tmp:
        out = os.path.join(tmp, "cg.out")
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-c", child]
        subprocess.run([*cmd, str(count)], env=env, cwd=tree, capture_output=True, check=True)
        with open(out, encoding="utf-8") as f:
            totals = re.search(r"^totals:\s+(\d+)", f.read(), re.M)
    assert totals is not None
    return int(totals.group(1))


def instructions(tree: str, setup: str, stmt: str, *, small: int = 200, large: int = 1200) -> float:
    """User-space instructions per execution of ``stmt`` (one line) after ``setup``, in ``tree``."""
    child = _CHILD.format(setup=setup, stmt=stmt)
    return (_ir(tree, child, large) - _ir(tree, child, small)) / (large - small)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.callgrind_stmt", description=__doc__)
    parser.add_argument("stmt", help="one line, run in a loop")
    parser.add_argument("--setup", default="", help="code run once before (its names are global)")
    parser.add_argument("--tree", default=".", help="the source tree (PYTHONPATH) to import from")
    parser.add_argument("--small", type=int, default=200)
    parser.add_argument("--large", type=int, default=1200)
    args = parser.parse_args(argv)
    figure = instructions(args.tree, args.setup, args.stmt, small=args.small, large=args.large)
    print(f"{figure:,.0f} instructions per execution of {args.stmt!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
