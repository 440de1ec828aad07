"""How the kernel spreads connections over ``SO_REUSEPORT`` sockets (why
``server/transport/workers.py`` does not rely on it): ``sockets`` listening sockets on one port, ``clients``
connections made at once, repeated.

    python -m bench.reuseport_spread --trials 200     # prints the trials outside a 35-65% split
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections import Counter

__all__ = ["spread_trial", "main"]


def spread_trial(sockets: int, clients: int) -> list[int]:
    """Connections each of ``sockets`` SO_REUSEPORT listeners received from ``clients`` connects."""
    listeners: list[socket.socket] = []
    conns: list[socket.socket] = []
    try:
        for _ in range(sockets):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(("127.0.0.1", listeners[0].getsockname()[1] if listeners else 0))
            s.listen(clients)
            s.setblocking(False)
            listeners.append(s)
        conns = [socket.create_connection(listeners[0].getsockname()) for _ in range(clients)]
        counts = []
        for s in listeners:
            n = 0
            while True:
                try:
                    accepted, _ = s.accept()
                except BlockingIOError:
                    break
                accepted.close()
                n += 1
            counts.append(n)
        return counts
    finally:
        for s in conns + listeners:
            s.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reuseport_spread")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args(argv)
    smallest: Counter[int] = Counter()
    outside = 0
    for _ in range(args.trials):
        counts = spread_trial(2, args.clients)
        smallest[min(counts)] += 1
        outside += min(counts) / args.clients < 0.35
    print(f"{outside} of {args.trials} trials outside 35-65%; smaller share: {sorted(smallest.items())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
