"""Side by side: reproarchive.minify against torch._functorch.fx_minifier.minifier.

    python benchmarks/minify_bench.py            # every case, both minifiers (~2 min on 2 cores)
    python benchmarks/minify_bench.py --quick    # small cases only (seconds; run by the tests)
    python benchmarks/minify_bench.py --json     # rows as JSON lines as well
    python benchmarks/minify_bench.py --no-torch --shrink-inputs   # ours with input moves: how often each succeeds

Both minifiers get the same graph, inputs and oracle (see minify_cases.py); oracle calls are
counted by the same wrapper, which also counts calls that repeat an earlier (graph code, input
metadata) query. Size is op nodes (call_function/method/module). Exit status 1 when our
minifier misses a known minimum or returns a graph that does not fail the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.minify_cases import Case, all_cases  # noqa: E402
from reproarchive.minifier import minify_with_stats, op_count  # noqa: E402
from reproarchive.minifier.candidate import fresh_copy  # noqa: E402

# PyTorch's minifier is quadratic on multi-culprit graphs; past this many oracle calls a run is
# stopped and reported as unfinished (a call count, not a time, so the table does not depend on load).
TORCH_CALL_CAP = 1000


class _Cap(Exception):
    pass


class _JudgeErrors(logging.Handler):
    """Counts exceptions PyTorch's accuracy judges swallow (``log.exception`` in debug_utils:
    a compile or runtime error inside the judge is reported as "does not fail")."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.count += 1


@contextlib.contextmanager
def judge_errors():
    logger = logging.getLogger("torch._dynamo.debug_utils")
    handler, propagate = _JudgeErrors(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False  # counted, not printed
    # ``same()`` logs every failed comparison at error level: one line per oracle call
    utils = logging.getLogger("torch._dynamo.utils")
    level = utils.level
    utils.setLevel(logging.CRITICAL)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
        utils.setLevel(level)


class Counted:
    """Counts oracle calls and exact repeats of an earlier query; stops a run past ``cap`` calls."""

    def __init__(self, oracle: Callable[[Any, list], bool], cap: int | None = None):
        self.oracle = oracle
        self.calls = 0
        self.seen: set = set()
        self.repeats = 0
        self.cap = cap

    def __call__(self, gm, inputs) -> bool:
        if self.cap is not None and self.calls >= self.cap:
            raise _Cap()
        self.calls += 1
        key = (gm.code, tuple((tuple(x.shape), tuple(x.stride()), str(x.dtype)) if isinstance(x, torch.Tensor)
                              else repr(x) for x in inputs))
        if key in self.seen:
            self.repeats += 1
        self.seen.add(key)
        return self.oracle(gm, inputs)


@dataclass
class Row:
    case: str
    kind: str
    oracle: str
    minifier: str
    ops_before: int
    minimum: int
    ops_after: int | None
    calls: int
    repeats: int
    wall_s: float
    same_failure: bool | None
    note: str = ""
    judge_errors: int = 0  # exceptions inside the judge (counted as "does not fail")
    passes: dict | None = None  # ours: per-pass tries/calls/cache hits/successes

    @property
    def reached(self) -> bool:
        return self.ops_after is not None and self.ops_after <= self.minimum and bool(self.same_failure)


def _check(case: Case, oracle_name: str):
    """"Still the same failure": the strict signature, or for accuracy cases the judge used."""
    if case.kind.startswith("accuracy") and oracle_name not in ("strict", "loose"):
        return case.oracle(oracle_name)
    return case.strict


def run_ours(case: Case, oracle_name: str, shrink_inputs: bool = False) -> Row:
    oracle = Counted(case.oracle(oracle_name))
    start = time.perf_counter()
    with judge_errors() as errors:
        result = minify_with_stats(case.gm, case.inputs, oracle, shrink_inputs=shrink_inputs)
    wall = time.perf_counter() - start
    same = _check(case, oracle_name)(result.gm, fresh_copy(result.inputs))
    note = f"memo hits {result.stats.cache_hits}"
    passes = {k: asdict(v) for k, v in result.stats.passes.items()}
    return Row(case.name, case.kind, oracle_name, "reproarchive", case.ops, case.minimum, op_count(result.gm),
               oracle.calls, oracle.repeats, wall, same, note, errors.count + result.stats.oracle_errors, passes)


def run_torch(case: Case, oracle_name: str) -> Row:
    from torch._functorch.fx_minifier import minifier

    oracle = Counted(case.oracle(oracle_name), TORCH_CALL_CAP)
    gm = copy.deepcopy(case.gm)
    start = time.perf_counter()
    note = ""
    ops_after = same = None
    sink = io.StringIO()
    with judge_errors() as errors:
        try:
            with contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
                out_gm, out_inputs = minifier(gm, list(case.inputs), oracle, dump_state=lambda *a: None)
            ops_after = op_count(out_gm)
            same = _check(case, oracle_name)(out_gm, fresh_copy(list(out_inputs)))
        except _Cap:
            note = "unfinished"
        except Exception as exc:  # report, do not crash the table
            note = f"{type(exc).__name__}: {str(exc).splitlines()[0][:60]}"
    wall = time.perf_counter() - start
    return Row(case.name, case.kind, oracle_name, "torch", case.ops, case.minimum, ops_after,
               oracle.calls, oracle.repeats, wall, same, note, errors.count)


def _fmt(row: Row | None) -> list[str]:
    if row is None:
        return ["", "", "", ""]
    size = row.note or "-" if row.ops_after is None else str(row.ops_after)
    if row.same_failure is False:
        size += " (other failure)"
    return [size, str(row.calls), f"{row.repeats}", f"{row.wall_s:.2f}"]


def table(pairs: list[tuple[Case, str, Row, Row | None]]) -> str:
    head = ["case", "oracle", "ops", "min", "ours ops", "ours calls", "ours repeats", "ours s",
            "torch ops", "torch calls", "torch repeats", "torch s", "calls ours/torch"]
    if any(o.judge_errors or (t and t.judge_errors) for _, _, o, t in pairs):
        head.append("judge errors ours/torch")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case, oracle, ours, theirs in pairs:
        ratio = f"{ours.calls / theirs.calls:.0%}" if theirs and theirs.calls else ""
        cells = [case.name, oracle, str(case.ops), str(case.minimum)] + _fmt(ours) + _fmt(theirs) + [ratio]
        if len(head) > len(cells):
            cells.append(f"{ours.judge_errors}/{theirs.judge_errors if theirs else ''}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


INPUT_MOVES = ("shrink_shapes", "narrow_dtypes", "fill_inputs")


def input_moves(pairs) -> str:
    """How often each input move succeeded (candidates judged, and adopted), over all rows."""
    lines = ["| move | rows where it succeeded | candidates judged | adopted |", "|---|---|---|---|"]
    for move in INPUT_MOVES:
        stats = [o.passes.get(move) for _, _, o, _ in pairs if o.passes and o.passes.get(move)]
        calls = sum(p["calls"] for p in stats)
        wins = sum(p["successes"] for p in stats)
        rows = sum(1 for p in stats if p["successes"])
        lines.append(f"| {move} | {rows}/{len(pairs)} | {calls} | {wins} ({wins / calls:.0%}) |" if calls
                     else f"| {move} | 0/{len(pairs)} | 0 | 0 |")
    return "\n".join(lines)


def run(quick: bool = False, with_torch: bool = True, only: str | None = None,
        log: Callable[[str], None] | None = None,
        shrink_inputs: bool = False) -> list[tuple[Case, str, Row, Row | None]]:
    torch.manual_seed(0)
    pairs = []
    for case in all_cases(quick=quick, only=only):
        for oracle in case.oracle_names():
            ours = run_ours(case, oracle, shrink_inputs)
            theirs = run_torch(case, oracle) if with_torch else None
            pairs.append((case, oracle, ours, theirs))
            if log:
                log(table([pairs[-1]]).splitlines()[-1])
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small cases only")
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch's minifier")
    parser.add_argument("--only", help="run cases whose name contains this")
    parser.add_argument("--json", action="store_true", help="also print one JSON object per row")
    parser.add_argument("--shrink-inputs", action="store_true",
                        help="ours also runs the input moves; prints how often each succeeded")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    pairs = run(args.quick, not args.no_torch, args.only, log=lambda s: print(s, file=sys.stderr, flush=True),
                shrink_inputs=args.shrink_inputs)
    print(table(pairs))
    if args.shrink_inputs:
        print()
        print(input_moves(pairs))
    single = [(o, t) for c, orc, o, t in pairs if c.kind == "one culprit" and t and t.calls]
    if single:
        worst = max(o.calls / t.calls for o, t in single)
        print(f"\nsingle-culprit cases: our calls are at most {worst:.0%} of PyTorch's")
    judged = [(o, t) for c, orc, o, t in pairs if orc == "torch" and t and t.calls]
    if judged:
        worst = max(o.calls / t.calls for o, t in judged)
        total = sum(o.calls for o, _ in judged) / sum(t.calls for _, t in judged)
        print(f"accuracy cases under PyTorch's judge: our calls are {total:.0%} of PyTorch's in total, "
              f"at most {worst:.0%} on one case")
    checked = [(c, o) for c, orc, o, t in pairs if orc != "loose"]
    missed = [f"{o.case}/{o.oracle}" for c, o in checked if not o.reached]
    print(f"reproarchive reached the known minimum (same failure) on {len(checked) - len(missed)}/{len(checked)} "
          f"rows{'; missed: ' + ', '.join(missed) if missed else ''}")
    print(f"total wall time {time.perf_counter() - start:.1f} s")
    if args.json:
        for _c, _orc, o, t in pairs:
            for row in (o, t):
                if row is not None:
                    print(json.dumps(asdict(row)))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
