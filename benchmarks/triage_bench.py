"""Triage a fleet against what a team does today: a shell loop of ``reproarchive run``.

    python benchmarks/triage_bench.py                 # 200 archives, 5 bugs, -j 2 (several minutes)
    python benchmarks/triage_bench.py --archives 40   # smaller
    python benchmarks/triage_bench.py --json          # also print the measurements as JSON
    python benchmarks/triage_bench.py --varied        # each bug said several ways: merged by culprit
    python benchmarks/triage_bench.py --dynamo --flaky --ray   # real captures, a flaky sixth bug, Ray too

In one run, on one corpus (``tests/support/fleet_corpus.py``: five seeded bugs packed from three
models, sixteen shapes and eight "machines"):

  group                  ``reproarchive triage DIR --group-only``: every index read and signed
  triage                 ``reproarchive triage DIR -j J``: group, then one replay and one minify
                         per group in fresh processes (the default engine)
  triage again           the same command: every verdict from the cache
  tasks started          ``triage`` as before its tasks were forked from a warm server: each task a
                         new ``python`` that imports torch itself (measured first, on an empty
                         verdict cache; the ratio against ``triage`` is the fork server's gain)
  shell loop             ``for f in DIR/*.tar.zst; do reproarchive run "$f"; done`` (one replay per
                         archive, which is what a team without triage runs; no minify, no grouping)

Every time is wall clock around one command (a fresh process, as a user runs it). The report
checks what triage found: 5 groups, none mixed (precision and recall of the grouping against the
bug each archive was built with), every group reproduced and minified. Exit status 1 otherwise.

``--varied`` builds the corpus whose bugs are each reached from more models (1-3 inputs, 1-2
outputs, a rank-3 input) and said several ways by their compiler (a node or an aten target in
the message, the function or the Tensor method): the signatures alone (``--group-only``, before
any minify) split those bugs; ``triage`` merges the groups whose minified culprits agree. Both
gradings are reported; the goal is precision 1.0 and recall >= 0.95 after merging.

``--dynamo`` makes every archive a real capture (the model run under ``torch.compile`` with
``reproarchive.capture`` around the bug's compiler); ``--flaky`` adds a sixth bug whose compile
fails one time in two (``fleet_corpus.racy_lowering``; its race falls in turn per graph, so the
run is repeatable); ``--ray`` also times ``triage --engine ray`` on a local Ray, from an empty
verdict cache. The report also times ``triage --against``: "another torch" in which the
lowering bugs are fixed (``FLEET_FIXED_ENV``), compared with this run's verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


#: ``for f in *.tar.zst; do reproarchive run "$f"; done``, reading the archives (and a --backend
#: where one is needed) from a list; prints each run's exit status.
LOOP = 'while read -r f extra; do "$@" run "$f" $extra >/dev/null 2>&1; echo $?; done < "$0"'


def _cli() -> list[str]:
    return [sys.executable, "-c", "from reproarchive.cli import main; main()"]


def _env() -> dict[str, str]:
    # the corpus' own compiler (support.fleet_corpus:no_lowering) is importable by the replays
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))


def _cli_started() -> list[str]:
    """The CLI with ``warm_children`` a no-op: every child a new ``python``, as before."""
    return [sys.executable, "-c", "import contextlib, reproarchive.child as c; "
            "c.warm_children = lambda *a, **k: contextlib.nullcontext(); "
            "import reproarchive; reproarchive.warm_children = c.warm_children; "
            "from reproarchive.cli import main; main()"]


def _timed(argv: list[str], *, capture: bool = True) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run(argv, env=_env(), capture_output=capture, text=True)
    return time.perf_counter() - start, done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archives", type=int, default=200)
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--no-loop", action="store_true", help="skip the shell loop (it dominates the run)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--varied", action="store_true", help="the corpus whose bugs are said several ways")
    parser.add_argument("--dynamo", action="store_true", help="every archive a real torch.compile capture")
    parser.add_argument("--flaky", action="store_true", help="a sixth bug, whose compile fails one time in two")
    parser.add_argument("--ray", action="store_true", help="also time triage --engine ray on a local Ray")
    parser.add_argument("--workdir", help="where to build the corpus (default: a temporary folder)")
    args = parser.parse_args(argv)

    from reproarchive.triage.grouping import precision_recall
    from support import fleet_corpus

    with tempfile.TemporaryDirectory(prefix="reproarchive-triage-bench-") as tmp:
        root = Path(args.workdir or tmp)
        start = time.perf_counter()
        bugs = (*fleet_corpus.BUGS, fleet_corpus.RACY_BUG) if args.flaky else fleet_corpus.BUGS
        members = fleet_corpus.build(root, args.archives, varied=args.varied, bugs=bugs, dynamo=args.dynamo)
        build_s = time.perf_counter() - start
        folder = root / "archives"
        (root / "race").mkdir()
        os.environ[fleet_corpus.RACE_DIR_ENV] = str(root / "race")  # after the build: the captures' race was a coin
        trust = ["--trust-backend", fleet_corpus.NO_LOWERING, "--trust-backend", fleet_corpus.RACY_LOWERING]
        group_s, grouped = _timed([*_cli(), "triage", str(folder), "--group-only", "--json"])
        started_s, started = _timed([*_cli_started(), "triage", str(folder), "-j", str(args.jobs), *trust, "--json"])
        shutil.rmtree(folder / ".reproarchive-triage")  # its verdicts: the next run replays again
        triage_s, first = _timed([*_cli(), "triage", str(folder), "-j", str(args.jobs), *trust, "--json"])
        again_s, second = _timed([*_cli(), "triage", str(folder), "-j", str(args.jobs), *trust, "--json"])
        report, cached = json.loads(first.stdout), json.loads(second.stdout)
        against_s, against = _against(folder, report, trust, fleet_corpus.FLEET_FIXED_ENV)
        ray_s = _on_ray(root, folder, trust) if args.ray else None
        truth = {str(m.path): m.bug for m in members}
        scores = precision_recall([[m["location"] for m in g["members"]] for g in report["groups"]], truth)
        # --group-only ran before any minify: the signatures alone, nothing to merge by
        signature_scores = precision_recall([[m["location"] for m in g["members"]]
                                             for g in json.loads(grouped.stdout)["groups"]], truth)
        loop_s = loop_codes = None
        if not args.no_loop:
            # the list the loop reads: each archive, and --backend for the custom compiler's ones
            # (``run`` imports a recorded module:function only when named, as triage's --trust-backend)
            listing = root / "loop.txt"
            listing.write_text("".join(
                f"{m.path}" + (f" --backend {_backend(m.bug)}" if _backend(m.bug) else "") + "\n" for m in members))
            loop_s, loop = _timed(["bash", "-c", LOOP, str(listing), *_cli()])
            loop_codes = {}
            for code in loop.stdout.split():
                loop_codes[code] = loop_codes.get(code, 0) + 1

    verdicts = [(g["verdicts"].get("replay", {}).get("status"), g["verdicts"].get("minify", {}).get("status"))
                for g in report["groups"]]
    results = {
        "archives": args.archives, "jobs": args.jobs, "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "build_s": round(build_s, 1), "group_s": round(group_s, 2), "triage_s": round(triage_s, 1),
        "triage_tasks_started_s": round(started_s, 1), "tasks_started": json.loads(started.stdout)["tasks"],
        "triage_again_s": round(again_s, 2), "shell_loop_s": round(loop_s, 1) if loop_s is not None else None,
        "shell_loop_exit_codes": loop_codes, "groups": len(report["groups"]), "grouping": scores,
        "varied": args.varied, "signature_grouping": signature_scores,
        "tasks_first": report["tasks"], "tasks_again": cached["tasks"], "verdicts": verdicts,
        "group_only_exit": grouped.returncode, "dynamo": args.dynamo, "flaky": args.flaky,
        "repeats": [g["repeats"]["text"] if g.get("repeats") else None for g in report["groups"]],
        "against_s": round(against_s, 1), "against": against, "ray_s": round(ray_s, 1) if ray_s else None,
    }
    rows = [("build the corpus (library pack)", results["build_s"]), ("group (--group-only)", results["group_s"]),
            (f"triage -j {args.jobs} (group + replay + minify per group)", results["triage_s"]),
            ("triage again (all cached)", results["triage_again_s"]),
            ("triage --against (another torch: the lowering bugs fixed)", results["against_s"]),
            (f"triage -j {args.jobs}, each task a new python (before)", results["triage_tasks_started_s"])]
    if ray_s is not None:
        rows.append((f"triage --engine ray (a local Ray, {os.cpu_count()} cpus; started in the run)", results["ray_s"]))
    if loop_s is not None:
        rows.append(("shell loop of `reproarchive run` over every archive", results["shell_loop_s"]))
    print(f"{args.archives} archives{' (varied)' if args.varied else ''}: by signature alone "
          f"{signature_scores['groups']} groups, precision {signature_scores['precision']:.3f}, "
          f"recall {signature_scores['recall']:.3f}; merged by culprit {len(report['groups'])} groups, "
          f"precision {scores['precision']:.3f}, recall {scores['recall']:.3f}, mixed groups {scores['mixed_groups']}")
    for name, seconds in rows:
        print(f"  {name:<58} {seconds:>8} s")
    print(f"  replays per group: {', '.join(str(r) for r in results['repeats'])}")
    print(f"  against: {against}")
    print(f"  tasks forked from a warm server: {results['triage_s'] / results['triage_tasks_started_s']:.2f}x "
          "the time of tasks started as new processes")
    if args.json:
        print(json.dumps(results, indent=2))
    ok = (scores["precision"] == 1.0 and scores["recall"] >= 0.95 and len(report["groups"]) == len(bugs)
          and all(v == ("reproduced", "minified") for v in verdicts) and cached["tasks"]["run"] == 0
          and results["tasks_started"] == report["tasks"])  # both ways did the same work
    return 0 if ok else 1


def _backend(bug: str) -> str | None:
    """The ``--backend`` a shell loop's ``run`` needs for ``bug``'s archives (a custom compiler)."""
    from support import fleet_corpus

    return {fleet_corpus.RACY_BUG: fleet_corpus.RACY_LOWERING}.get(bug, fleet_corpus.NO_LOWERING
                                                                   if bug.startswith("no-") else None)


def _against(folder: Path, report: dict, trust: list[str], fixed_env: str) -> tuple[float, dict]:
    """``triage --against`` this run's environment, from "another torch" (the lowering bugs
    fixed): seconds, and how many groups it says are fixed, still fail, ..."""
    env = dict(_env(), **{fixed_env: "sigmoid,tanh"})
    argv = [*_cli(), "triage", str(folder), "--action", "replay", *trust, "--against",
            report["environment"]["digest"][7:19], "--json"]
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    counts: dict[str, int] = {}
    for g in json.loads(done.stdout)["groups"]:
        status = (g.get("against") or {}).get("status", "none")
        counts[status] = counts.get(status, 0) + 1
    return seconds, counts


def _on_ray(root: Path, folder: Path, trust: list[str]) -> float:
    """``triage --engine ray`` on a copy of the fleet (an empty verdict cache), Ray started by it."""
    copy = root / "on-ray"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns(".reproarchive-triage"))
    seconds, done = _timed([*_cli(), "triage", str(copy), "--engine", "ray", *trust, "--json"])
    if done.returncode != 0:
        print(f"triage --engine ray failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    return seconds


if __name__ == "__main__":
    sys.exit(main())
