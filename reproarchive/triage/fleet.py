"""``triage``: a fleet of archives grouped by bug, one member per group replayed and minified,
every verdict cached, optionally compared with the verdicts of another environment.

The steps, each cheap before the next costs anything:

1. the source's archives are listed (a folder, a file listing paths or references, or a team
   store; minified archives, which record a parent, are left out: they are derived from an
   occurrence, not another one) and each one's index is read and signed (``grouping.signature_of``; a store archive's
   index is read from its inline bytes, no blob is downloaded);
2. archives are grouped by the signature's level (``--by``); a group's representative is its
   member with the fewest ops (cheapest to replay and minify), the oldest on a tie, among those
   that call no custom op or Triton kernel where the group has such members (a replay stands in
   for those from their recorded calls, and can only be inconclusive where a call was not
   recorded);
3. each representative's tasks are looked up in the verdict cache (``verdicts.VerdictCache``,
   keyed by archive, action and environment); only missing ones go to the executor
   (``engine``), and each verdict is cached the moment it arrives. ``minify`` is submitted after
   ``replay`` reproduced the failure (a group that no longer fails has nothing to shrink);
4. groups whose representatives minified to the same culprit (``culprits``: stage, exception
   type and ops of the smallest failing graph) merge into one: a bug said in several ways;
5. with ``against``, each group's replay verdict here is compared with the one stored for any
   of its members in that environment: fixed, still fails, fails differently, fails here only;
6. each group lists its replay verdict in every environment the cache holds (``history``): the
   torch releases it fails and passes on.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time
from typing import Callable

from reproarchive.errors import ArchiveError, ReproArchiveError
from reproarchive.format.plain import PlainRecord
from reproarchive.replay.outcome import DIFFERENT, PASSED, REPRODUCED
from reproarchive.replay.settings import ReplaySettings
from reproarchive.triage.culprits import MINIFIED, UNCHANGED, Culprit, merge_keys, read_culprit
from reproarchive.triage.engine import Executor, LocalExecutor, Task
from reproarchive.triage.fleet_sources import Member, ProgressFn, Source, Unreadable
from reproarchive.triage.grouping import DEFAULT_LEVEL, LEVELS, NO_FAILURE, Signature, group
from reproarchive.triage.history import Seen, seen_in
from reproarchive.triage.recheck import names_an_environment, other_environment, recheck
from reproarchive.triage.repeats import Repeats, combined, judging_repeat, measured, replays_wanted
from reproarchive.triage.verdicts import ERROR, TIMED_OUT, Environment, Verdict, VerdictCache

DEFAULT_ACTIONS = ("replay", "minify")
#: Actions worth doing only on a failure that reproduces here: run after the replay said so.
AFTER_REPLAY = ("minify", "bisect")

#: How a group's replay here compares with its replay in the ``against`` environment.
#: Said of the newer environment against the older one: this one against a digest's, or the one
#: ``--against`` names to replay in against this one (``TriageReport.rechecked``).
FIXED, STILL_FAILS, FAILS_DIFFERENTLY, FAILS_HERE_ONLY, PASSES_BOTH, NOT_THERE, NO_VERDICT = (
    "fixed", "still fails", "fails differently", "fails here only", "passes in both", "not triaged there",
    "no verdict")
#: In place of FAILS_HERE_ONLY when the other environment is the newer one.
FAILS_THERE_ONLY = "fails there only"


@dataclasses.dataclass(frozen=True)
class Comparison(PlainRecord):
    """A group's replay here against its replay in the other environment."""

    status: str  # FIXED, STILL_FAILS, ...
    there: Verdict | None  # the verdict stored for the other environment (for ``archive``)


@dataclasses.dataclass(frozen=True)
class Folded(PlainRecord):
    """A signature group merged into another because their minified culprits agree: the same
    bug, said another way."""

    text: str
    signature: Signature | None
    count: int
    representative: Member
    verdicts: dict[str, Verdict]


@dataclasses.dataclass(frozen=True)
class GroupReport(PlainRecord):
    """One bug: its signature, members, representative and verdicts."""

    number: int
    signature: Signature | None  # None: archives that record no failure
    text: str  # the signature in one line
    count: int
    first_seen: str
    last_seen: str
    variants: int  # how many structures (``Signature.structure``) its members have
    representative: Member
    members: tuple[Member, ...]
    verdicts: dict[str, Verdict]  # action -> verdict, for the representative, in this environment
    cached: tuple[str, ...]  # the actions whose verdict came from the cache
    against: Comparison | None = None
    culprit: Culprit | None = None  # what the representative minified to (``culprits``)
    folded: tuple[Folded, ...] = ()  # signature groups merged into this one: same culprit
    seen: tuple[Seen, ...] = ()  # its replay in every environment with a cached verdict (``history``)
    repeats: Repeats | None = None  # what its repeated replay measured: stable or flaky (``repeats``)


@dataclasses.dataclass(frozen=True)
class TriageReport(PlainRecord):
    """What ``triage`` found; ``to_plain()`` is ``triage --json``."""

    source: str
    level: str
    engine: str
    workers: int
    environment: Environment
    against: Environment | None
    archives: int
    groups: tuple[GroupReport, ...]
    unreadable: tuple[Unreadable, ...]
    tasks: dict[str, int]  # run, cached, crashed, timed_out, error
    elapsed_s: float
    cache: str  # where verdicts are kept
    #: ``against`` was replayed in by this run, and each group's ``against.status`` is said of it
    #: (fixed there); else of this environment against its cached verdicts (fixed here)
    rechecked: bool = False

    @property
    def complete(self) -> bool:
        """Every task reached a verdict (none crashed, hung or failed to start)."""
        return not (self.tasks.get("crashed") or self.tasks.get("timed_out") or self.tasks.get("error"))




def triage_fleet(source: str | os.PathLike, *, actions: tuple[str, ...] = DEFAULT_ACTIONS,
                 executor: Executor | None = None, settings: ReplaySettings | None = None,
                 trusted_backends: tuple[str, ...] = (), level: str = DEFAULT_LEVEL, max_time: float | None = None,
                 against: str | None = None, run: bool = True, progress: ProgressFn | None = None,
                 storage_options: dict | None = None, merge: bool = True, repeat: int | None = None) -> TriageReport:
    """Group the archives of ``source`` and run ``actions`` on one member per group (module
    docstring). ``executor``: where tasks run (default: one local process at a time);
    ``trusted_backends``: recorded ``module:function`` compilers the replays may import;
    ``run=False`` groups only (cached verdicts are still reported); ``against``: a digest prefix
    of another environment whose cached verdicts to compare with. ``progress`` receives one
    dict per event (``{"event": "signed" | "verdict", ...}``). ``merge``: join the groups whose
    minified culprits agree (``culprits``). ``repeat``: replays of each representative (default
    ``repeats.MEASURE``; ``repeats``)."""
    if level not in LEVELS:
        raise ReproArchiveError(f"unknown grouping level {level!r}", f"choose among {', '.join(LEVELS)}")
    start = time.monotonic()
    settings = settings or ReplaySettings()
    executor = executor or LocalExecutor(1)
    sources = Source.open(source, storage_options)
    cache = VerdictCache(sources.cache_store())
    members, unreadable, signatures, backends = sources.sign(progress)
    grouped = group(((m, signatures[m.location]) for m in members), level)
    # trusting a recorded compiler (``trusted_backends``) is not part of it: it only lets a task
    # start, and a task that could not start is not cached
    environment = executor.environment(settings)
    there, other = _against(cache, against, environment, run, progress)
    # each group's verdicts are keyed by what of the environment can decide them (its failure's stage)
    deciding = {key: environment.deciding(sig.stage if sig else None) for key, sig in grouped.signatures.items()}
    if run:
        for env in {e.digest: e for e in (environment, *deciding.values())}.values():
            cache.record_environment(env)
    reps = {key: min(ms, key=_cheapest_faithful) for key, ms in grouped.groups.items()}
    replays = replays_wanted(repeat) if run else 1  # grouping only: what the cache holds is the answer
    verdicts, cached, counts, partial = _cached(cache, reps, deciding, actions, replays)
    plan = _Plan(executor, cache, deciding, settings, trusted_backends, backends, max_time, sources.minify_output(),
                 replays)
    if run:
        plan.run(reps, verdicts, actions, counts, progress, partial)
    fresh = _recheck(cache, there, other, grouped, reps, verdicts, plan, counts, progress) if there else {}
    environments = cache.environments()
    culprits = _culprits(grouped, reps, _minified_anywhere(cache, environments, reps, verdicts),
                         storage_options) if merge else {}

    def compare(sig: Signature | None, ms: list[Member], replay: Verdict | None) -> Comparison | None:
        return (_compare(cache, other.deciding(sig.stage if sig else None), ms, replay, fresh, there is not None)
                if other else None)

    def history(keys: list[tuple]) -> tuple[Seen, ...]:
        return seen_in(cache, environments, [reps[k].digest for k in keys])

    groups = _group_reports(grouped, reps, verdicts, cached, signatures, culprits, compare, history)
    return TriageReport(source=os.fspath(source), level=level, engine=executor.name, workers=executor.workers,
                        environment=environment, against=other, archives=len(members), groups=groups,
                        unreadable=tuple(unreadable), tasks=counts, elapsed_s=round(time.monotonic() - start, 3),
                        cache=cache.store.url, rechecked=there is not None)


def _cached(cache: VerdictCache, reps: dict, deciding: dict, actions: tuple[str, ...],
            replays: int) -> tuple[dict, dict, dict, dict]:
    """(group key -> action -> the cached verdict, group key -> the actions cached, the task
    counts so far, group key -> a cached replay verdict of fewer than ``replays`` replays, to
    top up)."""
    verdicts: dict[tuple, dict[str, Verdict]] = {key: {} for key in reps}
    cached: dict[tuple, list[str]] = {key: [] for key in reps}
    partial: dict[tuple, list[Verdict]] = {}
    counts = {"run": 0, "cached": 0, "crashed": 0, "timed_out": 0, "error": 0}
    for key, rep in reps.items():
        for action in actions:
            hit = cache.get(deciding[key].digest, rep.digest, action)
            if hit is not None and action == "replay" and hit.replay_count < replays and not hit.failed_to_run:
                partial[key] = [hit]
            elif hit is not None:
                verdicts[key][action] = hit
                cached[key].append(action)
                counts["cached"] += 1
    return verdicts, cached, counts, partial


@dataclasses.dataclass
class _Plan:
    """How this run's tasks are made and where their verdicts go."""

    executor: Executor
    cache: VerdictCache
    environments: dict[tuple, Environment]  # group key -> the environment its verdicts are keyed by
    settings: ReplaySettings
    trusted: tuple[str, ...]
    backends: dict[str, str | None]  # index digest -> recorded backend
    max_time: float | None
    output: str
    replays: int  # replays of each representative (``repeats``)

    def task(self, rep: Member, action: str, replay: Verdict | None = None) -> Task:
        """``replay``: the group's replay verdict; a flaky one's minify judges each candidate, and
        its bisect each step, by as many replays as miss its failure under 1% of the time
        (``repeats.judging_repeat``)."""
        settings = self.settings
        # the recorded module:function compiler, where the user trusts it (--trust-backend)
        if settings.backend is None and self.backends.get(rep.digest) in self.trusted:
            settings = settings.replace(backend=self.backends[rep.digest])
        minify = action == "minify"
        return Task(action=action, archive=rep.location, digest=rep.digest, settings=settings.to_plain(),
                    output=self.output if minify else None, max_time=self.max_time,
                    repeat=judging_repeat(replay) if action in AFTER_REPLAY else None)

    def run(self, reps: dict, verdicts: dict, actions: tuple[str, ...], counts: dict,
            progress: ProgressFn | None, partial: dict) -> None:
        """Submit every task the cache lacks; minify and bisect after replay reproduced (or when
        replay is not asked for). A replay is ``replays`` tasks, topping up ``partial`` (a cached
        replay verdict of fewer): one, then the rest side by side unless that one reached no
        verdict (a hang is not waited for four times); one verdict when the last is back
        (``repeats``). Each verdict is cached as it arrives, except those that say nothing
        lasting about the archive here (timed out: depends on --max-time; error: the task could
        not start, e.g. an untrusted compiler)."""
        pending: dict[concurrent.futures.Future, tuple] = {}
        gathered: dict[tuple, list[Verdict]] = {key: list(partial.get(key, ())) for key in reps}
        running = dict.fromkeys(reps, 0)  # each group's replays submitted and not back yet

        def submit(key: tuple, action: str) -> None:
            missing = self.replays - sum(v.replay_count for v in gathered[key])
            for _ in range((missing if gathered[key] else 1) if action == "replay" else 1):
                task = self.task(reps[key], action, verdicts[key].get("replay"))
                pending[self.executor.submit(task)] = (key, action)
                running[key] += action == "replay"

        def after_replay(key: tuple) -> list[str]:
            """The actions that wait for a reproduced replay, now due."""
            if "replay" in actions and verdicts[key]["replay"].status != REPRODUCED:
                return []
            return [a for a in AFTER_REPLAY if a in actions and a not in verdicts[key]]

        for key in reps:
            for action in actions:
                if action not in verdicts[key] and (action not in AFTER_REPLAY or "replay" not in actions):
                    submit(key, action)
            if "replay" in verdicts[key]:
                for action in after_replay(key):
                    submit(key, action)
        done = 0
        while pending:
            finished, _ = concurrent.futures.wait(list(pending), return_when=concurrent.futures.FIRST_COMPLETED)
            for future in finished:
                key, action = pending.pop(future)
                verdict = dataclasses.replace(future.result(), environment=self.environments[key].digest)
                counts["run"] += 1
                if verdict.failed_to_run:
                    counts[verdict.status.replace(" ", "_")] += 1
                done += 1
                if progress is not None:
                    progress({"event": "verdict", "done": done, "total": done + len(pending),
                              "archive": reps[key].name, "verdict": verdict})
                if action == "replay":
                    gathered[key].append(verdict)
                    running[key] -= 1
                    if running[key]:
                        continue  # more replays of this one to come
                    if not verdict.failed_to_run and sum(v.replay_count for v in gathered[key]) < self.replays:
                        submit(key, action)  # the first came back with a verdict: the rest
                        continue
                    verdict = combined(gathered[key])
                self._keep(verdict, verdicts[key], action)
                if action == "replay":
                    for later in after_replay(key):
                        submit(key, later)

    def _keep(self, verdict: Verdict, verdicts: dict, action: str) -> None:
        if verdict.status not in (TIMED_OUT, ERROR):
            self.cache.put(verdict)
        verdicts[action] = verdict


def _against(cache: VerdictCache, against: str | None, here: Environment, run: bool,
             progress: ProgressFn | None) -> tuple[str | None, Environment | None]:
    """(the interpreter to re-check groups in, or None; the environment compared with)."""
    if not against:
        return None, None
    if not names_an_environment(against):
        return None, cache.find_environment(against)
    if not run:
        raise ReproArchiveError(f"--against {against} replays there, and --group-only runs nothing",
                                "drop --group-only, or give the digest of an environment with cached verdicts")

    def building(requirement: str, folder) -> None:
        if progress is not None:
            progress({"event": "building", "requirement": requirement, "folder": str(folder)})

    return other_environment(against, here, building)


def _recheck(cache: VerdictCache, python: str, other: Environment, grouped, reps: dict, verdicts: dict, plan: _Plan,
             counts: dict, progress: ProgressFn | None) -> dict[str, Verdict]:
    """Replay in ``other`` each group that still fails here (``recheck``); the verdicts reached,
    counted with this run's tasks."""
    todo = []
    for key, rep in reps.items():
        here = verdicts[key].get("replay")
        if here is None or here.failed_to_run or here.status == PASSED:
            continue
        sig = grouped.signatures[key]
        backend = plan.task(rep, "replay").settings.get("backend")
        todo.append((other.deciding(sig.stage if sig else None), rep, backend,
                     here.signature if here.status == REPRODUCED else None))
    fresh = recheck(cache, python, todo, plan.max_time, progress, replays=plan.replays)
    for verdict in fresh.values():
        counts["run"] += verdict.replay_count
        if verdict.failed_to_run:
            counts[verdict.status.replace(" ", "_")] += 1
    return fresh


def _group_reports(grouped, reps: dict, verdicts: dict, cached: dict, signatures: dict, culprits: dict,
                   compare: Callable, history: Callable) -> tuple[GroupReport, ...]:
    """One report per group after merging (``_merged``): the first signature group's signature,
    representative and verdicts, every merged group's members."""
    groups = []
    for number, keys in enumerate(_merged(grouped, culprits), 1):
        key = keys[0]
        sig = grouped.signatures[key]
        ms = [m for k in keys for m in grouped.groups[k]]
        seen = sorted(m.seen for m in ms)
        folded = tuple(Folded(text=_text(grouped.signatures[k]), signature=grouped.signatures[k],
                              count=len(grouped.groups[k]), representative=reps[k], verdicts=verdicts[k])
                       for k in keys[1:])
        groups.append(GroupReport(
            number=number, signature=sig, text=_text(sig), count=len(ms),
            first_seen=seen[0], last_seen=seen[-1],
            variants=len({signatures[m.location].structure for m in ms if signatures[m.location]}) or 1,
            representative=reps[key], members=tuple(sorted(ms, key=lambda m: (m.seen, m.name))),
            verdicts=verdicts[key], cached=tuple(cached[key]), against=compare(sig, ms, verdicts[key].get("replay")),
            culprit=culprits.get(key), folded=folded, seen=history(keys),
            repeats=measured(verdicts[key].get("replay"))))
    return tuple(groups)


def _text(sig: Signature | None) -> str:
    return sig.text() if sig else NO_FAILURE


def _minified_anywhere(cache: VerdictCache, environments: list[Environment], reps: dict,
                       verdicts: dict) -> dict[tuple, dict[str, Verdict]]:
    """Each group's verdicts, with a minify verdict from another environment where this one
    has none (a run of ``--action replay`` on a newer torch still merges by the culprit its
    groups minified to where they were triaged before)."""
    out = {}
    for key, rep in reps.items():
        mine = verdicts[key]
        if "minify" not in mine:
            there = (cache.get(env.digest, rep.digest, "minify") for env in environments)
            found = next((v for v in there if v is not None and v.status in (MINIFIED, UNCHANGED)), None)
            mine = {**mine, "minify": found} if found is not None else mine
        out[key] = mine
    return out


def _culprits(grouped, reps: dict, verdicts: dict, storage_options: dict | None) -> dict[tuple, Culprit | None]:
    """Each group's culprit: what its representative minified to (or the representative
    itself, when it was already as small as it gets); None without a minify verdict."""
    out = {}
    for key, rep in reps.items():
        minify = verdicts[key].get("minify")
        location = None
        if minify is not None and minify.status == MINIFIED and minify.minified is not None:
            location = minify.minified.location
        elif minify is not None and minify.status == UNCHANGED:
            location = rep.location
        try:
            out[key] = read_culprit(location, storage_options) if location else None
        except (ArchiveError, ReproArchiveError, OSError):
            out[key] = None  # the minified archive is gone or damaged: the group stays as it is
    return out


def _merged(grouped, culprits: dict) -> list[list[tuple]]:
    """The groups to report, each a list of signature-group keys (the first gives the group its
    signature and verdicts), largest first."""
    order = list(grouped.groups)
    into = merge_keys(culprits, order)
    merged: dict[tuple, list[tuple]] = {}
    for key in order:
        merged.setdefault(into[key], []).append(key)
    return sorted(merged.values(), key=lambda keys: -sum(len(grouped.groups[k]) for k in keys))


def _compare(cache: VerdictCache, other: Environment, members: list[Member], here: Verdict | None,
             fresh: dict[str, Verdict], newer_there: bool) -> Comparison:
    """``fresh``: verdicts this run reached there and did not cache (no verdict: why);
    ``newer_there``: the other environment is the newer one (``--against`` to replay in)."""
    there = next((v for m in members if (v := cache.get(other.digest, m.digest, "replay")) is not None), None)
    there = there or next((fresh[m.digest] for m in members if m.digest in fresh), None)
    if there is None:
        return Comparison(status=NOT_THERE, there=None)
    if here is None or here.failed_to_run or there.failed_to_run:
        return Comparison(status=NO_VERDICT, there=there)
    fails_here, fails_there = here.status != PASSED, there.status != PASSED
    old, new = (fails_here, fails_there) if newer_there else (fails_there, fails_here)
    if old and not new:
        status = FIXED
    elif new and not old:
        status = FAILS_THERE_ONLY if newer_there else FAILS_HERE_ONLY
    elif not fails_here:
        status = PASSES_BOTH
    elif here.status == DIFFERENT or there.status == DIFFERENT or here.signature != there.signature:
        status = FAILS_DIFFERENTLY
    else:
        status = STILL_FAILS
    return Comparison(status=status, there=there)


def _cheapest_faithful(member: Member) -> tuple:
    """A group's representative is the least of its members by this key (module docstring)."""
    return (member.outside > 0, member.ops, member.seen, member.name)
