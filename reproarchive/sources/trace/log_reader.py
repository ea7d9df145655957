"""Finding and reading TORCH_TRACE logs, and tlparse's output folders, into a ``Trace``.

``log_model`` holds the model (events, compiles, the trace) and what is derived from it; this
module finds logs (a file, a folder of per-rank files, a tlparse folder) and reads them line by
line, turning every problem a real log has into a ``TraceProblem`` instead of an exception.
No torch, no payload is run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from reproarchive.errors import SourceError
from reproarchive.sources.trace.log_model import MAX_EXAMPLE_LINES, Compile, Trace, TraceEvent, TraceProblem

# The glog prefix TorchLogsFormatter writes before each envelope (tlparse's own pattern: not
# anchored, so a prefix added by a log collector, e.g. "[rank3]:", does not hide the event).
_GLOG = re.compile(
    r"(?P<level>[VIWEC])(?P<month>\d{2})(?P<day>\d{2}) (?P<time>\d{2}:\d{2}:\d{2}\.\d{6}) "
    r"(?P<thread>\d+)(?P<pathname>[^:]+):(?P<line>\d+)\] (?P<json>\{.*)$"
)
# Envelope keys that are context, not the event (torch's reserved names, plus what tlparse
# adds to raw.jsonl).
_CONTEXT_KEYS = frozenset({
    "rank", "compiled_autograd_id", "frame_id", "frame_compile_id", "attempt", "severity",
    "timestamp", "pathname", "thread", "subgraph_name", "has_payload", "stack", "lineno",
    "payload_filename",
})
# Payloads worth keeping in memory; the rest (chromium events, output code, post-grad graphs)
# are only hashed, which keeps reading a multi-GB log cheap.
KEPT_PAYLOADS = frozenset({
    "dynamo_output_graph", "fx_graph_runnable", "dynamo_error", "torch_version",
    "recompile_reasons", "dynamo_graph_break_reason",
    # ATen graph code with every value's shape: the outputs of an operator a missing library defined
    "aot_inference_graph", "aot_forward_graph",
    # the graph Inductor's runnable prints, with the model line of each node (``printed_stacks``)
    "before_post_grad_graph",
})
# Of Inductor's output code only the descriptions of the devices it compiled for are kept
# (``triton_meta={'device': DeviceProperties(type='cuda', index=0, cc=90, ...)}``): what a compile
# for that GPU without it needs (``facts.system_record``).
DEVICE_PROPERTIES = re.compile(r"DeviceProperties\([^()]*\)")
TRACE_FILE_PREFIX = "dedicated_log_torch_trace"
_RANK_IN_NAME = re.compile(r"rank_(\d+)")
_SNIFF_BYTES = 1 << 16
_SNIFF_LINES = 64

# --------------------------------------------------------------------------------------------
# finding logs


def sniff_log(path: Path) -> bool:
    """Whether ``path`` is a TORCH_TRACE log: one of its first lines is a glog-prefixed envelope."""
    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except OSError:
        return False
    for raw in head.split(b"\n")[:_SNIFF_LINES]:
        line = raw.decode("utf-8", errors="replace")
        m = _GLOG.search(line)
        if m:
            try:
                return isinstance(json.loads(m["json"]), dict)
            except ValueError:
                continue
    return False


def _tlparse_roots(folder: Path) -> list[Path]:
    if (folder / "raw.jsonl").is_file():
        return [folder]
    return sorted(p for p in folder.iterdir() if p.is_dir() and (p / "raw.jsonl").is_file())


def find_trace(path: str | os.PathLike) -> tuple[str, list[Path]] | None:
    """("log" | "log folder" | "tlparse", files or tlparse roots) when ``path`` is a trace, else None.

    A folder is a tlparse output folder when it (or each of its sub-folders, as
    ``--all-ranks-html`` writes them) holds ``raw.jsonl``; otherwise a folder of logs when files
    directly in it are TORCH_TRACE logs (one per rank and process). Folders are not searched
    deeper: a trace folder is named, not discovered.
    """
    p = Path(path)
    if p.is_file():
        return ("log", [p]) if sniff_log(p) else None
    if not p.is_dir():
        return None
    try:
        roots = _tlparse_roots(p)
        if roots:
            return "tlparse", roots
        files = sorted(f for f in p.iterdir() if f.is_file())
    except OSError:
        return None
    logs = [f for f in files if f.name.startswith(TRACE_FILE_PREFIX) and sniff_log(f)]
    logs += [f for f in files if not f.name.startswith(TRACE_FILE_PREFIX) and f.suffix in (".log", ".txt", "")
             and sniff_log(f)]
    if not logs and (p / "tlparse").is_dir() and p.name == "torch_compile_debug":
        # TORCH_COMPILE_DEBUG=1 without TORCH_TRACE writes the trace to torch_compile_debug/tlparse/
        return find_trace(p / "tlparse")
    return ("log folder", sorted(logs)) if logs else None


def read_trace(path: str | os.PathLike) -> Trace:
    """Read a TORCH_TRACE log, a folder of them, or a tlparse output folder.

    SourceError (exit 4) when ``path`` does not exist, is none of these, or holds no compile.
    """
    p = Path(path)
    if not p.exists():
        raise SourceError(f"{path} does not exist",
                          "name a TORCH_TRACE log, a folder of them, or tlparse's output folder")
    found = find_trace(p)
    if found is None:
        raise SourceError(
            f"{path} is not a TORCH_TRACE log, a folder of them, or a tlparse output folder",
            "run the job with TORCH_TRACE=<folder> set and name that folder (or a log file in it)")
    kind, files = found
    reader = _Reader()
    for f in files:
        if kind == "tlparse":
            reader.read_tlparse(f)
        else:
            reader.read_log(f)
    trace = reader.finish(p, kind, files)
    if not trace.compiles:
        raise SourceError(
            f"{path} holds no compile (no event with a compile id)"
            + (f"; {trace.warnings[0]}" if trace.warnings else ""),
            "was torch.compile reached with TORCH_TRACE set? A log cut before the first compile has nothing to pack")
    return trace


# --------------------------------------------------------------------------------------------
# reading


class _Reader:
    """Accumulates events of several files into compiles; ranks and files are kept apart."""

    def __init__(self) -> None:
        self.compiles: dict[tuple, Compile] = {}
        self.problems: dict[tuple[str, str], TraceProblem] = {}
        self.torch_versions: dict[Any, dict[str, Any]] = {}
        self.strings: dict[Path, dict[int, str]] = {}
        self.ranks_seen: dict[Path, set] = {}

    def problem(self, file: Path, what: str, lineno: int | None = None) -> None:
        key = (str(file), what)
        prob = self.problems.get(key)
        if prob is None:
            prob = self.problems[key] = TraceProblem(file=file.name, what=what)
        prob.count += 1
        if lineno is not None and len(prob.lines) < MAX_EXAMPLE_LINES:
            prob.lines.append(lineno)

    # -- raw logs ----------------------------------------------------------------------

    def read_log(self, path: Path) -> None:
        file_rank = _rank_from_name(path.name)
        pending: tuple[dict, int, list[bytes], int] | None = None
        try:
            with open(path, "rb") as f:
                for lineno, raw in enumerate(f, 1):
                    raw = raw.rstrip(b"\n")
                    if raw.startswith(b"\t"):
                        if pending is None:
                            self.problem(path, "payload lines with no event before them (skipped)", lineno)
                        else:
                            pending[2].append(raw[1:])
                        continue
                    if pending is not None:
                        self._finish_raw(path, file_rank, *pending)
                        pending = None
                    if not raw.strip():
                        continue
                    line = raw.decode("utf-8", errors="replace")
                    m = _GLOG.search(line)
                    if m is None:
                        self.problem(path, "lines without a TORCH_TRACE envelope (skipped)", lineno)
                        continue
                    try:
                        env = json.loads(m["json"])
                    except ValueError:
                        self.problem(path, "lines that are not valid JSON, truncated or corrupted (skipped)", lineno)
                        continue
                    if not isinstance(env, dict):
                        self.problem(path, "envelopes that are not JSON objects (skipped)", lineno)
                        continue
                    pid = int(m["thread"])
                    if "has_payload" in env:
                        pending = (env, lineno, [], pid)
                    else:
                        self._event(path, file_rank, env, lineno, None, "none", None, pid=pid)
                if pending is not None:
                    self._finish_raw(path, file_rank, *pending)
        except OSError as err:
            raise SourceError(f"cannot read {path}: {err.strerror}", "check the path and permissions") from err

    def _finish_raw(self, path: Path, file_rank, env: dict, lineno: int, lines: list[bytes], pid: int) -> None:
        data = b"\n".join(lines)
        expected = env.get("has_payload")
        state = "ok" if isinstance(expected, str) and hashlib.md5(data, usedforsecurity=False).hexdigest() == expected \
            else "damaged"
        if state == "damaged":
            self.problem(path, "payloads whose MD5 does not match (truncated or edited; not used)", lineno)
        self._event(path, file_rank, env, lineno, _kept(_event_kind(env), data), state, None, pid=pid)

    # -- tlparse output -----------------------------------------------------------------

    def read_tlparse(self, root: Path) -> None:
        raw_jsonl = root / "raw.jsonl"
        file_rank = _rank_from_name(root.name)
        try:
            with open(raw_jsonl, "rb") as f:
                for lineno, raw in enumerate(f, 1):
                    if not raw.strip():
                        continue
                    try:
                        env = json.loads(raw.decode("utf-8", errors="replace"))
                    except ValueError:
                        self.problem(raw_jsonl, "lines that are not valid JSON, truncated or corrupted (skipped)",
                                     lineno)
                        continue
                    if not isinstance(env, dict):
                        self.problem(raw_jsonl, "envelopes that are not JSON objects (skipped)", lineno)
                        continue
                    kind = _event_kind(env)
                    page = env.get("payload_filename") if isinstance(env.get("payload_filename"), str) else None
                    text, state = None, "none"
                    if "has_payload" in env and page:
                        text, state = self._tlparse_payload(root, raw_jsonl, env, kind, page, lineno)
                    pid = env.get("thread") if isinstance(env.get("thread"), int) else None
                    self._event(raw_jsonl, file_rank, env, lineno, text, state, page, tlparse_root=root, pid=pid)
        except OSError as err:
            raise SourceError(f"cannot read {raw_jsonl}: {err.strerror}", "check the path and permissions") from err

    def _tlparse_payload(self, root: Path, raw_jsonl: Path, env: dict, kind: str, page: str, lineno: int):
        if kind not in KEPT_PAYLOADS and kind != "inductor_output_code":
            return None, "ok"
        target = (root / page)
        try:
            inside = target.resolve().is_relative_to(root.resolve())
        except OSError:
            inside = False
        if os.path.isabs(page) or not inside or not target.is_file():
            self.problem(raw_jsonl, "payload pages named in raw.jsonl that are missing (not used)", lineno)
            return None, "missing"
        data = target.read_bytes()
        if kind not in KEPT_PAYLOADS:  # output code: its device descriptions only, checked or not
            return _kept(kind, data), "ok"
        if hashlib.md5(data, usedforsecurity=False).hexdigest() == env.get("has_payload"):
            return data.decode("utf-8", errors="replace"), "ok"
        meta = env.get("artifact") if isinstance(env.get("artifact"), dict) else {}
        if meta.get("encoding") == "json":
            # tlparse pretty-prints JSON artifacts, so their pages never match the MD5
            try:
                return json.dumps(json.loads(data)), "ok"
            except ValueError:
                pass
        self.problem(raw_jsonl, "payloads whose MD5 does not match (truncated or edited; not used)", lineno)
        return data.decode("utf-8", errors="replace"), "damaged"

    # -- routing -------------------------------------------------------------------------

    def _event(self, path: Path, file_rank, env: dict, lineno: int, text: str | None, state: str,
               page: str | None, *, tlparse_root: Path | None = None, pid: int | None = None) -> None:
        kind = _event_kind(env)
        if kind == "string_table" and isinstance(env.get("string_table"), list):
            # tlparse's raw.jsonl starts with the log's interned file names, by index
            self.strings.setdefault(path, {}).update(enumerate(map(str, env["string_table"])))
            return
        if kind == "str":
            value = env.get("str")
            if isinstance(value, list) and len(value) == 2 and isinstance(value[1], int):
                self.strings.setdefault(path, {})[value[1]] = str(value[0])
            return
        rank = env.get("rank") if isinstance(env.get("rank"), int) else file_rank
        if rank is not None:
            self.ranks_seen.setdefault(path, set()).add(rank)
        if kind == "torch_version" and text is not None and state == "ok":
            try:
                info = json.loads(text)
            except ValueError:
                info = None
            if isinstance(info, dict):
                self.torch_versions[(path, rank)] = info
            return
        ids = tuple(env.get(k) if isinstance(env.get(k), int) else None
                    for k in ("compiled_autograd_id", "frame_id", "frame_compile_id"))
        if ids[1] is None and ids[2] is None:
            return  # not inside a compile (chromium events, global artifacts)
        key = (path, rank, *ids)
        comp = self.compiles.get(key)
        if comp is None:
            comp = self.compiles[key] = Compile(log=path, rank=rank, compiled_autograd_id=ids[0], frame_id=ids[1],
                                                frame_compile_id=ids[2], tlparse_root=tlparse_root)
        attempt = env.get("attempt") if isinstance(env.get("attempt"), int) else None
        comp.events.append(TraceEvent(kind=kind, lineno=lineno, attempt=attempt, metadata=env.get(_event_key(env)),
                                      payload=text, payload_state=state, page=page, pid=pid))

    def finish(self, root: Path, kind: str, files: list[Path]) -> Trace:
        for path, ranks in self.ranks_seen.items():
            if len(ranks) > 1:
                prob = TraceProblem(file=path.name,
                                    what=f"ranks interleaved in one file ({', '.join(map(str, sorted(ranks)))}); "
                                    "their compiles are kept apart by rank", count=1)
                self.problems[(str(path), "ranks")] = prob
        comps = sorted(self.compiles.values(), key=lambda c: (
            -1 if c.rank is None else c.rank, str(c.log), _sort_id(c.compiled_autograd_id),
            _sort_id(c.frame_id), _sort_id(c.frame_compile_id)))
        return Trace(root=root, kind=kind, files=files, compiles=comps, problems=list(self.problems.values()),
                     torch_versions=self.torch_versions, strings=self.strings)


def _sort_id(v: int | None) -> int:
    return -1 if v is None else v


def _rank_from_name(name: str) -> int | None:
    m = _RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else None


def _event_key(env: dict) -> str | None:
    return next((k for k in env if k not in _CONTEXT_KEYS), None)


def _kept(kind: str, data: bytes) -> str | None:
    """What of a payload stays in memory: all of a kept kind's, the device descriptions of
    Inductor's output code (one per line, each once), nothing of any other."""
    if kind in KEPT_PAYLOADS:
        return data.decode("utf-8", errors="replace")
    if kind == "inductor_output_code":
        found = DEVICE_PROPERTIES.findall(data.decode("utf-8", errors="replace"))
        return "\n".join(dict.fromkeys(found)) or None
    return None


def _event_kind(env: dict) -> str:
    key = _event_key(env)
    if key == "artifact" and isinstance(env.get("artifact"), dict):
        return str(env["artifact"].get("name") or "artifact")
    return key or "unknown"
