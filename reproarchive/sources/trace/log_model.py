"""The model of a TORCH_TRACE log, and tlparse's output folders: events, compiles, the trace.

A ``TORCH_TRACE`` log is what ``torch._logging.trace_structured`` writes: one glog-prefixed
JSON envelope per event (``{"dynamo_output_graph": {...}, "frame_id": 0, "frame_compile_id":
1, "attempt": 0, "rank": 3, "has_payload": "<md5>"}``), followed by its payload as lines that
start with a tab. tlparse renders such a log as a folder of pages plus ``raw.jsonl`` (the
envelopes, each naming the page that holds its payload as ``payload_filename``).

``log_reader`` turns either into ``Compile`` objects keyed by rank and compile id; this
module holds them and derives what ``reproarchive ls`` shows and ``reproarchive pack`` needs:
the graph payloads, the inputs' ``describe_*`` metadata, the symbols, the config, the torch
version and the failure. It never
imports torch (``ls`` stays instant) and never runs a payload: the Python payloads are handed to
a child process by ``pack_trace``.

Real logs are messy, and every problem becomes a ``TraceProblem`` line instead of an
exception: lines cut mid-JSON by a crash, payloads whose MD5 does not match (such payloads are
never used), several ranks interleaved in one file, logs from older torch versions (no
``attempt``, no config in the metrics, graphs printed without strides), and cache hits that log
the ``fx_graph_runnable`` a second time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from reproarchive.context import failure as failure_records
from reproarchive.errors import SourceError

MAX_EXAMPLE_LINES = 5
# The exception torch wraps a backend's error in, and how the wrapped one is named in its message.
WRAPPED_ERROR = re.compile(r"^(?:backend='(?P<backend>[^']*)' raised:\s*\n)?"
                           r"(?P<type>[A-Za-z_][\w.]*)(?:: ?(?P<msg>.*))?$",
                      re.DOTALL)
_EXC_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Failed|Unsupported|Interrupt|Exit|"
                       r"Warning|Fault|Abort|Break|Timeout|Mismatch|Failure))(?:: (?P<msg>.*))?$")


# --------------------------------------------------------------------------------------------
# records of the log


@dataclass
class TraceEvent:
    """One envelope: its kind (the artifact name for ``artifact`` events), where it is, and its
    payload when it is one we keep. ``payload_state`` is "none" (no payload), "ok", "damaged"
    (MD5 mismatch, truncated) or "missing" (a tlparse page that is not there)."""

    kind: str
    lineno: int
    attempt: int | None
    metadata: Any
    payload: str | None = None
    payload_state: str = "none"
    page: str | None = None
    pid: int | None = None  # the process that logged it (glog's field; tlparse's "thread")


@dataclass
class Compile:
    """Everything one rank logged for one compile id (all attempts of it)."""

    log: Path
    rank: int | None
    compiled_autograd_id: int | None
    frame_id: int | None
    frame_compile_id: int | None
    events: list[TraceEvent] = field(default_factory=list)
    tlparse_root: Path | None = None  # set when read from a tlparse output folder

    # -- identity ------------------------------------------------------------------------

    @property
    def id(self) -> str:
        """The compile id as torch and tlparse print it, without brackets: "0/1", "!2/0/1"."""
        fid = "-" if self.frame_id is None else str(self.frame_id)
        fcid = "-" if self.frame_compile_id is None else str(self.frame_compile_id)
        prefix = "" if self.compiled_autograd_id is None else f"!{self.compiled_autograd_id}/"
        return f"{prefix}{fid}/{fcid}"

    @property
    def label(self) -> str:
        return f"[{self.id}]" + ("" if self.rank is None else f" rank {self.rank}")

    @property
    def attempt(self) -> int:
        """The last attempt (Dynamo restarts analysis after a graph break inside a compile)."""
        attempts = [e.attempt for e in self.events if e.attempt is not None]
        return max(attempts) if attempts else 0

    @property
    def tlparse_directory(self) -> str:
        """The folder tlparse writes this compile's pages into (``CompileId::as_directory_name``)."""
        def part(v):
            return "-" if v is None else str(v)
        return "_".join(part(v) for v in (self.compiled_autograd_id, self.frame_id, self.frame_compile_id,
                                          self.attempt))

    # -- events ------------------------------------------------------------------------

    def of_kind(self, kind: str, *, final_attempt: bool = False) -> list[TraceEvent]:
        final = self.attempt
        return [e for e in self.events if e.kind == kind
                and (not final_attempt or e.attempt is None or e.attempt == final)]

    def last(self, kind: str) -> TraceEvent | None:
        found = self.of_kind(kind)
        return found[-1] if found else None

    @property
    def metrics(self) -> dict[str, Any]:
        ev = self.last("compilation_metrics")
        return ev.metadata if ev is not None and isinstance(ev.metadata, dict) else {}

    @property
    def graph_event(self) -> TraceEvent | None:
        """The Dynamo graph (``dynamo_output_graph``) of the final attempt, if it was logged."""
        found = self.of_kind("dynamo_output_graph", final_attempt=True) or self.of_kind("dynamo_output_graph")
        return found[-1] if found else None

    def runnables(self) -> list[TraceEvent]:
        """Distinct ``fx_graph_runnable`` payloads in log order (a cache hit logs one again)."""
        seen: set[str] = set()
        out = []
        for ev in self.of_kind("fx_graph_runnable"):
            key = ev.payload if ev.payload is not None else f"line {ev.lineno}"
            if key not in seen:
                seen.add(key)
                out.append(ev)
        return out

    # -- what ls shows -----------------------------------------------------------------

    @property
    def failed(self) -> bool:
        return bool(self.metrics.get("fail_type")) or self.last("dynamo_error") is not None

    @property
    def status(self) -> str:
        """"failed", "ok", or "incomplete" (the log ends inside the compile: a crash, a kill, or a
        cut log); " (no graph)" when Dynamo logged no graph for it, " (graph damaged)" when its
        payload fails its MD5."""
        if self.failed:
            status = "failed"
        elif self.last("compilation_metrics") is None:
            status = "incomplete"
        else:
            status = "ok"
        if self.graph_event is None:
            status += " (no graph)"
        elif self.graph_event.payload_state != "ok":
            status += " (graph damaged)"
        return status

    @property
    def fail_reason(self) -> str:
        m = self.metrics
        if m.get("fail_type"):
            reason = str(m.get("fail_reason") or "").strip()
            inner = WRAPPED_ERROR.match(reason) if m["fail_type"] in failure_records.WRAPPERS else None
            if inner and inner.group("type"):
                # the error inside torch's wrapper is the one that names the bug
                backend = f" (backend {inner.group('backend')})" if inner.group("backend") else ""
                msg = (inner.group("msg") or "").strip().splitlines()
                head = inner.group("type") + (f": {msg[0]}" if msg else "") + backend
                return "\n".join([head, *msg[1:]])
            return f"{m['fail_type']}: {reason}" if reason else str(m["fail_type"])
        err = self.last("dynamo_error")
        if err is not None and err.payload:
            line = last_exception_line(err.payload)
            if line:
                return line
        if self.status.startswith("incomplete"):
            return "the log ends inside this compile (the process crashed or was killed, or the log is cut)"
        return ""

    @property
    def frame(self) -> dict[str, Any]:
        """Where the compiled code is: function name, file, first line (from the metrics, else
        the last frame of ``dynamo_start``'s user stack)."""
        m = self.metrics
        if m.get("co_name"):
            return {"name": m.get("co_name"), "file": m.get("co_filename"), "line": m.get("co_firstlineno")}
        start = self.last("dynamo_start")
        stack = (start.metadata or {}).get("stack") if start is not None and isinstance(start.metadata, dict) else None
        if isinstance(stack, list) and stack and isinstance(stack[-1], dict):
            top = stack[-1]
            return {"name": top.get("name"), "file": top.get("filename"), "line": top.get("line")}
        return {"name": None, "file": None, "line": None}

    @property
    def op_count(self) -> int | None:
        count = self.metrics.get("graph_op_count")
        if isinstance(count, int):
            return count
        ev = self.graph_event
        if ev is not None and ev.payload is not None and ev.payload_state == "ok":
            return count_graph_ops(ev.payload)
        return None

    @property
    def cache(self) -> dict[str, int]:
        """How often the FX graph cache hit, missed or was bypassed, and how often the runnable
        was logged (a hit logs it again from the cache entry)."""
        out = {k: len(self.of_kind(f"fx_graph_cache_{k}")) for k in ("hit", "miss", "bypass")}
        out["runnables_logged"] = len(self.of_kind("fx_graph_runnable"))
        return {k: v for k, v in out.items() if v}

    def row(self, *, display_log: str | None = None) -> dict[str, Any]:
        """What ``reproarchive ls`` prints for this compile (``--json`` gives the whole dict)."""
        frame = self.frame
        return {
            "compile_id": self.id,
            "rank": self.rank,
            "attempt": self.attempt,
            "frame": frame,
            "ops": self.op_count,
            "status": self.status,
            "fail_reason": self.fail_reason,
            "graph": "dynamo_output_graph" if self.graph_event is not None else None,
            "runnables": len(self.runnables()),
            "cache": self.cache,
            "log": display_log or self.log.name,
            "tlparse_directory": self.tlparse_directory,
        }


@dataclass
class TraceProblem:
    """One kind of defect in one file, with how often and where (for a one-line warning)."""

    file: str
    what: str
    lines: list[int] = field(default_factory=list)
    count: int = 0

    def __str__(self) -> str:
        where = ""
        if self.lines:
            shown = ", ".join(str(n) for n in self.lines[:MAX_EXAMPLE_LINES])
            more = " ..." if self.count > len(self.lines[:MAX_EXAMPLE_LINES]) else ""
            where = f" (line{'s' if self.count > 1 else ''} {shown}{more})"
        return f"{self.file}: {self.count} {self.what}{where}"


@dataclass
class Trace:
    """The compiles of one or more logs, and what was wrong with the logs."""

    root: Path
    kind: str  # "log" | "log folder" | "tlparse"
    files: list[Path]
    compiles: list[Compile]
    problems: list[TraceProblem]
    torch_versions: dict[Any, dict[str, Any]]  # (file, rank) -> torch_version payload
    strings: dict[Path, dict[int, str]]  # interned file names per file

    @property
    def warnings(self) -> list[str]:
        return [str(p) for p in self.problems if p.count]

    def display_log(self, c: Compile) -> str:
        try:
            if self.kind == "tlparse":
                return str(c.log.relative_to(self.root.parent))
            return str(c.log.relative_to(self.root)) if self.root.is_dir() else c.log.name
        except ValueError:
            return c.log.name

    def torch_version(self, c: Compile) -> dict[str, Any]:
        return (self.torch_versions.get((c.log, c.rank)) or self.torch_versions.get((c.log, None))
                or next((v for (f, _), v in self.torch_versions.items() if f == c.log), None) or {})

    def select(self, compile_ids: Iterable[str] = (), *, all_compiles: bool = False,
               rank: int | None = None) -> list[Compile]:
        """The compiles to pack: those named (``0/1``, ``[0/1]``, ``!0/0/1``), or all, or by
        default the failed and incomplete ones; ``rank`` keeps one rank. SourceError when a named
        id is not in the log or nothing is selected."""
        pool = [c for c in self.compiles if rank is None or c.rank == rank]
        if rank is not None and not pool:
            ranks = sorted({str(c.rank) for c in self.compiles})
            raise SourceError(f"no compile of rank {rank} in {self.root}", f"ranks in the log: {', '.join(ranks)}")
        wanted = [normalise_compile_id(cid) for cid in compile_ids]
        if wanted:
            picked = [c for c in pool if c.id in wanted]
            missing = [w for w in wanted if not any(c.id == w for c in picked)]
            if missing:
                raise SourceError(
                    f"compile {', '.join(missing)} is not in {self.root}"
                    + (f" (rank {rank})" if rank is not None else ""),
                    f"`reproarchive ls {self.root}` lists the compiles in the log")
            return picked
        if all_compiles:
            return pool
        picked = [c for c in pool if c.failed or c.status.startswith("incomplete")]
        if not picked:
            raise SourceError(
                f"no compile failed in {self.root} ({len(pool)} compile{'s' if len(pool) != 1 else ''}, all ok)",
                "name one with --compile-id (see `reproarchive ls`), or pass --all; runtime and accuracy "
                "failures are not in TORCH_TRACE logs, so give --backend (and --accuracy) too")
        return picked


def normalise_compile_id(text: str) -> str:
    """"[0/1]", "0/1", "[0/1_2]" (an attempt) and "!0/0/1" to the form ``Compile.id`` uses."""
    s = str(text).strip()
    if s.startswith("[") and s.endswith("]"):
        s = s[1:-1]
    s = re.sub(r"_\d+$", "", s)
    if not re.fullmatch(r"(?:!\d+/)?(?:\d+|-)/(?:\d+|-)", s):
        raise SourceError(f"{text!r} is not a compile id", "write it as tlparse does: 0/1 or [0/1] (frame/compile)")
    return s


# --------------------------------------------------------------------------------------------
# reading payloads


def count_graph_ops(code: str) -> int:
    """Calls in a ``print_readable`` graph: assignments whose value is not a bare name or an
    attribute of ``self`` (placeholder renames and get_attr lines), as Dynamo's op count."""
    count = 0
    for line in code.splitlines():
        m = re.match(r"^\s+[A-Za-z_]\w*(?:\s*:\s*\"[^\"]*\")?\s*=\s*(.+?)(?:;.*)?$", line)
        if not m:
            continue
        value = m.group(1).strip()
        if re.fullmatch(r"[A-Za-z_]\w*|self(?:\.\w+)+", value):
            continue
        count += 1
    return count


def last_exception_line(tb: str) -> str:
    """The "Type: message" line that ends a traceback (the message's first line)."""
    lines = [ln.rstrip() for ln in tb.splitlines()]
    for i in range(len(lines) - 1, -1, -1):
        m = _EXC_LINE.match(lines[i].strip()) if lines[i] and not lines[i].startswith(" ") else None
        if m:
            return lines[i].strip()
    return ""
