"""Progress bars for long work (packing or checking gigabytes, minifying).

Bars go to stderr, only when it is a terminal and the work is large enough to be worth one,
so scripts and CI logs stay clean; ``enabled=True/False`` overrides the guess.
"""

from __future__ import annotations

import sys
from typing import Optional

AUTO_THRESHOLD_BYTES = 256 << 20


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def bar(total: Optional[int], desc: str, *, enabled: Optional[bool] = None, unit: str = "B"):
    if enabled is None:
        enabled = sys.stderr.isatty() and (total is None or unit != "B" or total >= AUTO_THRESHOLD_BYTES)
    if not enabled:
        return _Silent()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, unit_divisor=1024 if unit == "B" else 1000,
                file=sys.stderr, leave=False, dynamic_ncols=True)


def human_size(n: int) -> str:
    """Bytes for people: 512 B, 3.4 MiB."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
