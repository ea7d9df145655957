"""Where a group's bug was seen: its replay verdict in every environment the verdict cache holds.

The cache already keeps, per environment, what each replay concluded (``verdicts``); a team
that triages on each torch it moves to (or compares with ``--against``) has there, for every
group, the torch releases the bug fails on and the ones it passes on. That is the bug's life
from first report to fix, read back from the store rather than kept in a second record that
could disagree with it.
"""

from __future__ import annotations

import dataclasses
import re

from reproarchive.format.plain import PlainRecord
from reproarchive.triage.verdicts import Environment, VerdictCache


@dataclasses.dataclass(frozen=True)
class Seen(PlainRecord):
    """A group's replay in one environment: the torch and device there, and what it concluded
    (``reproduced``, ``passed``, ``different failure``)."""

    torch: str
    device: str
    environment: str  # the environment's digest
    status: str
    finished: str  # when that verdict was reached (ISO 8601 UTC)


def seen_in(cache: VerdictCache, environments: list[Environment], digests: list[str]) -> tuple[Seen, ...]:
    """The replay verdicts cached for any of ``digests`` (a group's representatives), one per
    environment that has one, oldest torch first; verdicts that say nothing of the archive (a
    task that crashed, timed out or could not start) are left out."""
    out = []
    for env in environments:
        verdict = next((v for d in digests if (v := cache.get(env.digest, d, "replay")) is not None), None)
        if verdict is None or verdict.failed_to_run:
            continue
        out.append(Seen(torch=env.torch, device=env.device, environment=env.digest, status=verdict.status,
                        finished=verdict.finished))
    return tuple(sorted(out, key=lambda s: (_release(s.torch), s.finished)))


def _release(version: str) -> tuple:
    """``2.13.0+cpu`` -> (2, 13, 0, '+cpu'): releases in order, a local build after its release."""
    numbers = re.match(r"(\d+(?:\.\d+)*)(.*)", version)
    if numbers is None:
        return ((), version)
    return (tuple(int(n) for n in numbers.group(1).split(".")), numbers.group(2))
