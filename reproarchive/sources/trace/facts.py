"""What one compile of a TORCH_TRACE log says, as the records an archive keeps: its failure and
the backend that raised it, its config, the machine, its inputs' ``describe_*`` metadata and
symbols, graph breaks and recompiles, the user's stack and the job's paths; and the custom ops
a job's runnable calls beside its collectives (``blind_stand_ins``: which graph to pack).

Separate from ``log_model``, which reads a log into events and compiles: that side must cope
with every kind of damage a log can carry; this side reads compiles that are already well
formed. Neither imports torch or runs a payload.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterable

from reproarchive.context import failure as failure_records
from reproarchive.format.schema import FailureRecord
from reproarchive.sources.trace.log_model import WRAPPED_ERROR, Compile, Trace, last_exception_line


def _exception_block(tb: str) -> tuple[str, str]:
    """(qualified type, full message) of the final exception of a Python traceback."""
    lines = tb.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback (most recent call last):"):
            # the exception starts at the first unindented line after the frames
            for j in range(i + 1, len(lines)):
                if lines[j] and not lines[j].startswith(" "):
                    head, _, rest = lines[j].partition(": ")
                    message = "\n".join([rest, *lines[j + 1:]]).strip()
                    return head.strip(), message
            break
    line = last_exception_line(tb)
    head, _, rest = line.partition(": ")
    return head, rest


def failure_record(c: Compile, *, backend: str | None) -> tuple[FailureRecord | None, list[str]]:
    """(failure record as the log tells it, compiler diagnostics), or (None, []) for a compile
    that did not fail. Incomplete compiles get an "unknown" record that says so.

    torch wraps a backend's error (BackendCompilerFailed, InductorError); the record names the
    wrapped error as the archive's own capture does (``failure.innermost``), because that is
    what a replay observes. The log names it without its module ("ReluCompileError"), so the
    signature here matches a replay's only once ``rebuild_child`` has replayed it and confirmed.
    """
    if not c.failed:
        if c.status.startswith("incomplete"):
            return failure_records.unknown_record(c.fail_reason, backend=backend), []
        return None, []
    m = c.metrics
    err = c.last("dynamo_error")
    tb = err.payload if err is not None and err.payload_state == "ok" and err.payload else ""
    outer_type, outer_msg = _exception_block(tb) if tb else ("", "")
    fail_type = str(m.get("fail_type") or outer_type.rsplit(".", 1)[-1] or "Exception")
    reason = str(m.get("fail_reason") if m.get("fail_reason") is not None else outer_msg)
    exc_type, message = (outer_type or fail_type), reason
    if fail_type in failure_records.WRAPPERS:
        inner = WRAPPED_ERROR.match(reason.strip())
        if inner and inner.group("type"):
            exc_type, message = inner.group("type"), (inner.group("msg") or "").strip()
    diagnostics = failure_records.compiler_diagnostics(tb or reason)
    # the compiler's own error lines first, not the thousands of warning lines before them
    shown = failure_records.with_diagnostics(message, diagnostics)[:failure_records.MAX_MESSAGE_CHARS]
    record = FailureRecord(stage="compile", exception_type=exc_type, message=shown,
                           traceback=(tb or reason)[-failure_records.MAX_TRACEBACK_CHARS:],
                           signature=failure_records.signature("compile", exc_type, message,
                                                               diagnostics[0] if diagnostics else ""),
                           backend=backend)
    return record, diagnostics


def _named_backend(c: Compile) -> str | None:
    reason = str(c.metrics.get("fail_reason") or "")
    err = c.last("dynamo_error")
    for text in (reason, err.payload if err is not None and err.payload else ""):
        m = re.search(r"backend='([^']+)' raised", text)
        if m:
            return m.group(1)
    return None


def _uses_inductor(c: Compile) -> bool:
    return bool(c.runnables() or c.of_kind("inductor_output_code") or c.of_kind("inductor_post_grad_graph")
                or c.metrics.get("fail_type") == "InductorError" or c.metrics.get("inductor_compile_time_s"))


def backend_from_log(c: Compile, trace: Trace | None = None) -> tuple[str | None, str]:
    """(backend name, how we know it). The log names the backend only when it failed
    (``backend='x' raised``); Inductor is recognised by its artifacts. A compile without either
    takes the backend another compile of the same process named in its failure (one job, one
    ``torch.compile`` backend, as a rule; the origin says so); otherwise it is unknown."""
    named = _named_backend(c)
    if named:
        return named, "named in the failure logged for this compile"
    if _uses_inductor(c):
        return "inductor", "Inductor artifacts in the log"
    others = {(o.id, b) for o in (trace.compiles if trace else []) if o.log == c.log and o.rank == c.rank
              and (b := _named_backend(o))}
    if len({b for _, b in others}) == 1:
        cid, name = sorted(others)[0]
        return name, f"named in the failure of compile [{cid}] of the same process (this one left no trace of it)"
    return None, "not recorded in TORCH_TRACE logs"


def config_values(c: Compile) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """({config module: {key: value}}, notes): the full configs compilation_metrics records
    (dynamo, inductor, functorch, torch.compiler), as JSON strings in torch >= 2.5."""
    m = c.metrics
    out: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for key, module in (("dynamo_config", "torch._dynamo.config"), ("inductor_config", "torch._inductor.config"),
                        ("functorch_config", "torch._functorch.config"), ("compiler_config", "torch.compiler.config")):
        raw = m.get(key)
        if raw is None:
            continue
        try:
            values = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            notes.append(f"{module} in the log is not JSON ({str(raw)[:60]!r}); not recorded")
            continue
        if isinstance(values, dict):
            out[module] = values
    if not out:
        notes.append("the log records no config (torch older than 2.5 or a compile that never finished)")
    return out, notes


def system_record(trace: Trace, c: Compile, runnable: str | None) -> dict[str, Any]:
    """The system facts a log holds: torch version and commit, CUDA, Triton, Python, and the
    GPU names fx_graph_runnable's header lists. Everything else about the machine is unknown."""
    tv = trace.torch_version(c)
    m = c.metrics
    torch_version = tv.get("pytorch_version") or m.get("pytorch_version")
    cuda = m.get("cuda_version")
    system: dict[str, Any] = {
        "origin": "torch_trace",
        "partial": True,  # only what the log says; every other fact about the job's machine is unknown
        "torch": {"version": torch_version, "git_version": tv.get("commit"), "cuda": cuda},
        "python": {"version": str(m["python_version"]).split()[0]} if m.get("python_version") else {},
        "packages": {"torch": torch_version, "triton": m.get("triton_version") or None},
    }
    if runnable:
        gpus = re.findall(r"^# (.+?) : (\d+) *$", runnable.split("# GPU Hardware Info:", 1)[1], re.M) \
            if "# GPU Hardware Info:" in runnable else []
        if gpus:
            listed = [{"name": name.strip(), "count": int(n)} for name, n in gpus]
            system["cuda"] = {"available": True, "version": cuda, "devices": _described_gpus(c, listed)}
        for key, label in (("# torch git version:", "git_version"), ("# torch cuda version:", "cuda")):
            for line in runnable.splitlines()[:400]:
                if line.startswith(key) and not system["torch"].get(label):
                    value = line[len(key):].strip()
                    system["torch"][label] = None if value == "None" else value
    return system


#: ``DeviceProperties(...)`` fields Inductor's output code prints, as the system record names them.
_PROPERTY_FIELDS = {"multi_processor_count": "multi_processor_count", "warp_size": "warp_size",
                    "regs_per_multiprocessor": "regs_per_multiprocessor",
                    "max_threads_per_multi_processor": "max_threads_per_multi_processor"}


def _described_gpus(c: Compile, listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The GPUs fx_graph_runnable's header lists (``listed``: names and counts), with what
    Inductor's output code says of each CUDA device it compiled for (``DeviceProperties``: index,
    compute capability, SM count, warp size, registers and threads per SM), when the header lists
    one kind of GPU (the device is then that kind). Otherwise the list as it is."""
    described: dict[int, dict[str, Any]] = {}
    for ev in c.of_kind("inductor_output_code"):
        for text in (ev.payload or "").splitlines():
            fields = dict(re.findall(r"(\w+)=('[^']*'|-?\d+)", text))
            if fields.get("type") != "'cuda'" or not fields.get("index", "").isdigit() or "cc" not in fields:
                continue
            cc = int(fields["cc"])
            entry = {"index": int(fields["index"]), "capability": f"{cc // 10}.{cc % 10}"}
            entry.update({ours: int(fields[k]) for k, ours in _PROPERTY_FIELDS.items() if k in fields})
            described.setdefault(entry["index"], entry)
    if len(listed) != 1 or not described:
        return listed
    return [{**listed[0], **entry} for _, entry in sorted(described.items())]


def describe_inputs(c: Compile) -> dict[str, dict[str, Any]]:
    """The input tensors Dynamo described in the final attempt, by the placeholder name Dynamo
    gives their source (``L['self']._modules['lin']._parameters['weight']`` ->
    ``L_self_modules_lin_parameters_weight_``): dtype, size, stride, device, storage, view base,
    requires_grad, is_leaf, is_parameter, as ``describe_tensor``/``describe_storage`` logged them."""
    final = c.attempt
    storages: dict[tuple, dict] = {}
    tensors: dict[tuple, dict] = {}
    out: dict[str, dict[str, Any]] = {}
    for ev in c.events:
        if ev.attempt not in (None, final) or not isinstance(ev.metadata, dict):
            continue
        md = ev.metadata
        describer = md.get("describer_id")
        if ev.kind == "describe_storage":
            storages[(describer, md.get("id"))] = md
        elif ev.kind == "describe_tensor":
            tensors[(describer, md.get("id"))] = md
        elif ev.kind == "describe_source":
            t = tensors.get((describer, md.get("id")))
            source = md.get("source")
            if t is None or not isinstance(source, str):
                continue
            st = storages.get((describer, t.get("storage")))
            base = tensors.get((describer, t.get("base"))) if t.get("base") is not None else None
            out[re.sub(r"[^a-zA-Z0-9]+", "_", source)] = {
                "source": source,
                "dtype": str(t.get("dtype", "")).replace("torch.", "") or None,
                "shape": t.get("size"),
                "stride": t.get("stride"),
                "storage_offset": t.get("storage_offset", 0),
                "device": _device_text(t.get("device")),
                "requires_grad": bool(t.get("requires_grad", False)),
                "is_leaf": bool(t.get("is_leaf", False)),
                "is_parameter": bool(t.get("is_parameter", False)),
                "is_view": bool(t.get("is_view", False)),
                "storage": t.get("storage"),
                "storage_bytes": st.get("size") if st else None,
                "view_base_shape": base.get("size") if base else None,
            }
    return out


def _device_text(value: Any) -> str | None:
    """"device(type='cuda', index=0)" -> "cuda:0"."""
    if not isinstance(value, str):
        return None
    m = re.fullmatch(r"device\(type='(\w+)'(?:, index=(\d+))?\)", value)
    if m:
        return m.group(1) + (f":{m.group(2)}" if m.group(2) is not None else "")
    return value


def symbols(c: Compile) -> dict[str, dict[str, Any]]:
    """Symbols the shape env created in the final attempt: hint, source, value range."""
    out: dict[str, dict[str, Any]] = {}
    final = c.attempt
    for ev in c.of_kind("create_symbol"):
        md = ev.metadata if isinstance(ev.metadata, dict) else {}
        if ev.attempt not in (None, final) or not isinstance(md.get("symbol"), str):
            continue
        try:
            hint = int(md.get("val"))
        except (TypeError, ValueError):
            hint = None
        out[md["symbol"]] = {"hint": hint, "source": md.get("source"), "range": md.get("vr")}
    return out


def graph_breaks_and_recompiles(c: Compile) -> dict[str, list[str]]:
    """The reasons the log gives for this compile's graph breaks and recompiles (first lines)."""
    out: dict[str, list[str]] = {}
    for kind, key in (("dynamo_graph_break_reason", "graph_breaks"), ("recompile_reasons", "recompile_reasons")):
        texts = []
        for ev in c.of_kind(kind):
            if ev.payload is None or ev.payload_state != "ok":
                continue
            text = ev.payload
            if kind == "recompile_reasons":
                try:
                    value = json.loads(text)
                    text = "\n".join(map(str, value)) if isinstance(value, list) else str(value)
                except ValueError:
                    pass
            first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
            if first and first not in texts:
                texts.append(first[:300])
        if texts:
            out[key] = texts
    return out


def user_stack(trace: Trace, c: Compile, limit: int = 8) -> list[dict[str, Any]]:
    """The user frames ``dynamo_start`` logged (file names resolved through the log's intern
    table; the innermost ``limit`` frames)."""
    start = c.last("dynamo_start")
    stack = start.metadata.get("stack") if start is not None and isinstance(start.metadata, dict) else None
    if not isinstance(stack, list):
        return []
    names = trace.strings.get(c.log, {})
    out = []
    for frame in stack[-limit:]:
        if not isinstance(frame, dict):
            continue
        fn = frame.get("filename")
        out.append({"file": names.get(fn, fn) if isinstance(fn, int) else fn, "line": frame.get("line"),
                    "name": frame.get("name"), "code": frame.get("loc")})
    return out


def job_paths(trace: Trace, c: Compile) -> dict[str, str]:
    """Prefixes of the job's machine seen in the log, to scrub from what goes into the archive
    (spec §8: no absolute path of the machine in a record): its site-packages (where torch
    lives), the folders of the user's code in the stack and tracebacks ("<job>"), and the
    Inductor cache dir the runnable names."""
    out: dict[str, str] = {}
    candidates = list(trace.strings.get(c.log, {}).values())
    err = c.last("dynamo_error")
    if err is not None and err.payload:
        candidates += re.findall(r'File "([^"]+)"', err.payload)[:200]
    frame_file = c.frame.get("file")
    if isinstance(frame_file, str):
        candidates.append(frame_file)
    for path in candidates:
        path = str(path)
        m = re.match(r"^(.*?)/torch/_(?:dynamo|inductor|logging|functorch|subclasses)/", path)
        if m and m.group(1):
            out[m.group(1)] = "<site-packages>"
        elif os.path.isabs(path) and "/site-packages/" not in path and "/lib/python" not in path:
            out.setdefault(os.path.dirname(path), "<job>")  # the user's own code
    for ev in c.runnables():
        m = re.search(r"^os\.environ\['TORCHINDUCTOR_CACHE_DIR'\] = '([^']+)'", ev.payload or "", re.M)
        if m:
            out[m.group(1)] = "<inductor-cache>"
    return out


def events_lines(c: Compile, kinds: Iterable[str]) -> dict[str, int]:
    """Where each used artifact is in the log (its line, for someone reading the raw log)."""
    out = {}
    for kind in kinds:
        ev = c.last(kind)
        if ev is not None:
            out[kind] = ev.lineno
    return out


#: operator namespaces of torch itself: an op of any other is the program's (a custom op)
_TORCH_NAMESPACES = frozenset({"aten", "prims", "higher_order", "_c10d_functional", "c10d_functional",
                               "_c10d_functional_autograd", "_dtensor", "inductor", "quantized", "profiler"})


def blind_stand_ins(code: str) -> list[str]:
    """The custom ops a runnable's graph calls when that graph also issues collectives. Such a
    graph is not replayed at pack time (it would run without its peers), so a stand-in made
    from the runnable would record no call of the op and every replay would miss it; the
    Dynamo graph's log gives the op's output shapes instead. Read from the log's text, never run."""
    if "_c10d_functional." not in code:
        return []
    return sorted({f"{ns}::{name}" for ns, name in re.findall(r"torch\.ops\.(\w+)\.(\w+)", code)
                   if ns not in _TORCH_NAMESPACES})
