"""What the payload rules cost, against baselines in the same run: ``python -m bench.payload_rules``.

Append side: ``encode_item`` (rules walk + msgspec encoding) against msgspec encoding alone (what the
engine did before the rules) and against the SDK's own parsing of the same item (pydantic-core in the
legacy era, stdlib json in the 2026-07-28 era), which every server append pays anyway. Read side:
``decode_item`` (decoding + bracket count + walk when many) against msgspec decoding alone. Best of 7
repeats; figures in microseconds per item.
"""

from __future__ import annotations

import json
import random
import timeit
from collections.abc import Callable
from typing import Any

import msgspec
import pydantic_core

from logstore.core.batch import decode_item, encode_item


def items() -> dict[str, dict[str, Any]]:
    rng = random.Random(1)
    return {
        "chat message (~220 B)": {
            "role": "user",
            "text": "x" * 150,
            "ts": 1733212345.123,
            "meta": {"tool": "search", "n": 3, "ok": True},
        },
        "search results (~70 KiB)": {
            "hits": [
                {
                    "title": "t" * 40,
                    "url": f"https://x/{i}",
                    "snippet": "lorem ipsum\n" * 10,
                    "meta": {"rank": i},
                }
                for i in range(300)
            ]
        },
        "256 KiB ASCII text": {"text": "a" * (256 * 1024 - 20)},
        "256 KiB non-ASCII text": {"text": "é" * (128 * 1024 - 20)},
        "embedding, 1536 floats": {"embedding": [rng.random() for _ in range(1536)]},
        "256 KiB int array": {"v": [rng.randrange(10**6) for _ in range(35000)]},
        "256 KiB of small objects": {
            "rows": [
                {"id": i, "name": f"n{i}", "score": 1.5, "tags": ["a", "b"], "ok": None} for i in range(3800)
            ]
        },
    }


def best(fn: Callable[[], object], size: int) -> float:
    number = max(3, 200_000 // max(size, 100))
    return min(timeit.repeat(fn, number=number, repeat=7)) / number * 1e6


def main() -> None:
    encode = msgspec.json.Encoder().encode
    decode = msgspec.json.Decoder().decode
    print(
        f"{'item':26} {'bytes':>7} | {'encode':>8} {'+rules':>8} {'ratio':>6} | {'pydantic':>8} {'json':>8}"
        f" | {'decode':>8} {'+rules':>8} {'ratio':>6}"
    )
    for name, item in items().items():
        print(f"{name:26} {row(item, encode, decode)}")


def row(item: dict[str, Any], encode: Callable[[Any], bytes], decode: Callable[[bytes], Any]) -> str:
    raw = encode(item)
    text, size = raw.decode(), len(raw)
    t_enc = best(lambda: encode(item), size)
    t_rules = best(lambda: encode_item(item, 0), size)
    t_pyd = best(lambda: pydantic_core.from_json(raw), size)
    t_json = best(lambda: json.loads(text), size)
    t_dec = best(lambda: decode(raw), size)
    t_read = best(lambda: decode_item(raw, seq=0), size)
    return (
        f"{size:7d} | {t_enc:8.1f} {t_rules:8.1f} {t_rules / t_enc:6.2f} | {t_pyd:8.1f} {t_json:8.1f}"
        f" | {t_dec:8.1f} {t_read:8.1f} {t_read / t_dec:6.2f}"
    )


if __name__ == "__main__":
    main()
