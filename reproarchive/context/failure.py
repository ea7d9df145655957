"""The failure record and the signature that decides "is this the same failure?".

PyTorch's minifier compares errors with ``difflib`` ratios or substring checks and so drifts to
unrelated errors. We compare a normalised signature instead: the stage, the exception type and
the message with everything that legitimately changes between runs (node and buffer names,
numbers, addresses, paths) masked. Capture writes the record, replay and minify compare against
it. The record type itself, ``FailureRecord``, is declared with the rest of the index in
``reproarchive.format.schema``.
"""

from __future__ import annotations

import dataclasses
import re
import traceback as _traceback

from reproarchive.context.failure_signature import (  # noqa: F401 - the signature's rule, re-exported
    DIAGNOSTIC_MARK,
    WRAPPERS,
    compiler_diagnostics,
    device_fault,
    exception_type_name,
    innermost,
    normalise_message,
    same_failure_as,
    signature,
    signature_of,
    timeout_signature,
)
from reproarchive.format.schema import AccuracyReport, FailureRecord, Stage

#: What each stage is called in a report.
KIND_BY_STAGE = {
    "compile": "compile error",
    "forward": "runtime error (forward)",
    "backward": "runtime error (backward)",
    "accuracy": "accuracy failure",
    "crash": "crash",
    "unknown": "unknown failure",
    "timeout": "collective timeout (hang)",
}


#: What a rank's collective says when another rank's process went away (gloo, NCCL): a
#: consequence, never the cause. Lower case; the job script carries the same words.
PEER_GONE_WORDS = ("connection closed by peer", "connection reset by peer", "broken pipe",
                   "remote process exited", "communicator was aborted")


def says_a_peer_went_away(message: str | None) -> bool:
    """Whether a failure's message only says that another rank went away."""
    said = (message or "").lower()
    return any(words in said for words in PEER_GONE_WORDS)


def failure_kind(record: FailureRecord | None) -> str:
    """"passed" for no failure, else the kind of failure ("compile error", "crash", a fault on
    the device by its class and stage: "device fault (illegal address, forward)", ...)."""
    if record is None:
        return "passed"
    fault = device_fault(record.signature)
    if fault is not None:
        return f"device fault ({fault}, {record.stage})"
    return KIND_BY_STAGE.get(record.stage, "unknown failure")


def faults_the_device(record: FailureRecord | None) -> bool:
    """Whether ``record`` is a fault on the device (``device_fault``): after one, every later use
    of the device in that process fails, so a replay of it, or a replay after it, needs a
    process of its own."""
    return record is not None and device_fault(record.signature) is not None


MAX_MESSAGE_CHARS = 4000
MAX_TRACEBACK_CHARS = 20000


def record_from_exception(exc: BaseException, stage: str, *, backend: str | None = None) -> FailureRecord:
    """Build the failure record for an exception raised while compiling or running a graph.

    When the message quotes a compiler's output (g++, nvcc, Triton), its error lines come right
    after the first line, under "compiler errors:", instead of the command line and the
    thousands of warning lines that may precede them (the traceback keeps the whole output):
    ``inspect`` and ``run`` show them, and the first one is part of the signature."""
    if stage not in frozenset(Stage):
        raise ValueError(f"unknown failure stage {stage!r}")
    exc_type, full, diagnostics, signed = signature_of(exc, stage)
    message = with_diagnostics(full, diagnostics)[:MAX_MESSAGE_CHARS]
    tb = "".join(_traceback.format_exception(type(exc), exc, exc.__traceback__))
    return FailureRecord(stage=stage, exception_type=exc_type, message=message, traceback=tb[-MAX_TRACEBACK_CHARS:],
                         signature=signed, backend=backend)


def as_collective_timeout(record: FailureRecord | None) -> FailureRecord | None:
    """``record`` as a ``timeout`` failure where ``timeout_signature`` (the one rule for a hang)
    says its error is a collective that waited past its timeout, otherwise ``record`` unchanged."""
    if record is None:
        return record
    stage, signed = timeout_signature(record.stage, record.exception_type, record.message, record.signature)
    return record if stage == record.stage else dataclasses.replace(record, stage=stage, signature=signed)


def with_diagnostics(message: str, diagnostics: list[str]) -> str:
    """The message's first line and the compiler's error lines, without the compiler's command
    line and warnings (the whole output stays in the record's traceback)."""
    if not diagnostics:
        return message
    lines = message.strip().splitlines()
    return "\n".join([lines[0] if lines else "", "", "compiler errors:", *diagnostics])


def compiler_errors(message: str) -> list[str]:
    """The compiler error lines a failure message holds (``with_diagnostics``), for display."""
    lines = str(message).splitlines()
    if "compiler errors:" not in lines:
        return []
    start = lines.index("compiler errors:") + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def accuracy_record(report: AccuracyReport, *, backend: str | None = None) -> FailureRecord:
    """Failure record for a compiled result that differs from eager beyond tolerance.

    ``report`` holds the tolerance and the per-output error figures; the signature of every
    accuracy failure is the same, because "still wrong" is the only property that matters
    when replaying or minifying one.
    """
    return FailureRecord(stage="accuracy", exception_type="AccuracyError",
                         message=report.summary or "compiled result differs from eager",
                         signature=signature("accuracy", "AccuracyError", ""), backend=backend, accuracy=report)


def crash_record(name: str, message: str, output: str, *, backend: str | None = None) -> FailureRecord:
    """The process running the compiler died (``name``: the signal, e.g. SIGSEGV, or exit
    status); ``output`` is the end of what it printed. The signature is the signal alone: the
    crash site's output varies run to run.

    The message gets the native runtime's own last words (``terminate called after throwing
    ...``, a device-side assert) and the traceback the crashing thread's Python stack, taken
    from faulthandler's report: its other threads' stacks (a progress monitor, a DataLoader)
    and its list of extension modules say nothing about the crash and are left out.
    """
    native, stack = crash_report(output)
    if native:
        message = "\n".join([message, *native])
    return FailureRecord(stage="crash", exception_type=name, message=message[:MAX_MESSAGE_CHARS],
                         traceback=stack[-MAX_TRACEBACK_CHARS:], signature=signature("crash", name, ""),
                         backend=backend)


def pending_crash_record(*, backend: str | None = None) -> FailureRecord:
    """The failure of an archive written just before compiled code first runs, which stays on
    disk only if the process dies there: a ``crash`` whose signal is not known (empty
    ``exception_type``), which ``same_failure`` matches with a crash of any signal."""
    return FailureRecord(stage="crash", exception_type="",
                         message="the process died while the compiled graph ran for the first time (this archive "
                                 "was written just before it ran, so the signal is not recorded)",
                         signature=signature("crash", "", ""), backend=backend)


#: faulthandler's words for the fatal signals it reports (``Fatal Python error: <words>``)
_FAULT_SIGNALS = {"Aborted": "SIGABRT", "Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS",
                  "Floating-point exception": "SIGFPE", "Floating point exception": "SIGFPE",
                  "Illegal instruction": "SIGILL"}
_FIRST_STACK = re.compile(r"(?:Current thread|Thread) 0x|Stack \(most recent call first\)")


def fault_signal(report: str) -> str | None:
    """The signal faulthandler's ``report`` of a death names (``SIGSEGV``, ...), None where it
    names none for sure: the process that died wrote it, so whoever completes its archive can
    record the signal, and a signal not known for sure is left unknown, never guessed.

    Threads that fault at once (a kernel's OpenMP workers all throwing) write their headers
    into each other (``Fatal Python error: Fatal Python error: AbortedAborted``): the signal is
    the one signal named before the first stack, where the words may be interleaved."""
    start = report.find("Fatal Python error")
    if start < 0:
        return None
    head = _FIRST_STACK.split(report[start:], maxsplit=1)[0]
    named = {signal for words, signal in _FAULT_SIGNALS.items() if words in head}
    return named.pop() if len(named) == 1 else None


_FATAL = re.compile(r"Fatal Python error: ")
_THREAD = re.compile(r"(Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):")
_WARNING = re.compile(r"\b\w*Warning: ")
#: a log line of torch's (glog's layout, ``W1128 21:38:22.732000 4691 torch/utils/cpp_extension.py:183] ...``),
#: info or warning: a CUDA build on a machine without the GPU writes one at import
_TORCH_LOG = re.compile(r"^[IW]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")
_FRAME = re.compile(r'^  File ".*", line \d+ in ')
_NATIVE_LINES = 6
#: what a native runtime says as it gives up: libstdc++'s, a failed C assert, CUDA's device assert
_RUNTIME_WORDS = re.compile(r"terminate called|^\s*what\(\):|Assertion .* failed|device-side assert")


def crash_report(output: str) -> tuple[list[str], str]:
    """(what the native runtime said just before the crash, faulthandler's report with only the
    crashing thread's stack), from a dead process's output.

    The crashing thread is the one faulthandler calls "Current thread". A crash on a thread
    Python does not know (an OpenMP worker running a kernel) has none; then the main thread's
    stack is kept (the one not started by ``threading``), which is where the kernel was
    called from, and the report says so. Python warnings and the lines they quote, and torch's
    own info and warning log lines, are not the runtime's words and are left out. Without a
    faulthandler report (killed from outside): no lines, and the output's last lines.
    """
    lines = str(output).splitlines()
    start = max((i for i, ln in enumerate(lines) if _FATAL.search(ln)), default=None)
    if start is None:
        return [], "\n".join(lines[-40:])
    head = _FATAL.search(lines[start]).start()
    if head:  # two threads wrote at once: "terminate called ... 'Fatal Python error: intAborted"
        lines[start:start + 1] = [lines[start][:head], lines[start][head:]]
        start += 1
    native: list[str] = []
    for ln in reversed(lines[:start]):
        if not ln.strip() or len(native) >= _NATIVE_LINES:
            break
        if _WARNING.search(ln) or _TORCH_LOG.match(ln) or (ln[:1].isspace() and not ln.strip().startswith("what():")):
            continue
        native.insert(0, ln.rstrip())
    if not any(_RUNTIME_WORDS.search(ln) for ln in native):
        # several threads wrote at once, or the exception's own text ended in a blank line: the
        # runtime's words are further up, among other output
        said = [ln.rstrip() for ln in lines[max(0, start - 200):start] if _RUNTIME_WORDS.search(ln)]
        native = [*said[-_NATIVE_LINES:], *native][:_NATIVE_LINES] if said else native
    blocks: list[tuple[str, list[str]]] = []
    for ln in lines[start + 1:]:
        header = _THREAD.search(ln)
        if header:
            blocks.append((ln[header.start():].rstrip(), []))
        elif ln.startswith("Extension modules:") or not ln.strip():
            if blocks and blocks[-1][1]:
                blocks.append(("", []))  # the end of a block
        elif blocks and blocks[-1][0] and _FRAME.match(ln):
            blocks[-1][1].append(ln.rstrip())
        # anything else inside a block is another thread's output written at the same moment
    blocks = [b for b in blocks if b[0]]
    current = [b for b in blocks if b[0].startswith("Current thread")]
    if current:
        chosen, note = current[0], []
    else:
        chosen = _main_thread(blocks)
        note = ["(it crashed on a thread Python does not run, such as a kernel's worker; the main thread's stack:)"]
    kept = [lines[start].rstrip(), *note]
    if chosen is not None:
        kept += [chosen[0], *chosen[1]]
    return native, "\n".join(kept)


def _main_thread(blocks: list[tuple[str, list[str]]]) -> tuple[str, list[str]] | None:
    """The main thread's block: the one whose outermost frame is a module's top level (a script,
    ``python -m``); else one not started by ``threading``; else the longest."""
    def outermost_is_module(frames):
        return bool(frames) and (frames[-1].endswith("in <module>") or "_run_module_as_main" in frames[-1])

    def started_by_threading(frames):
        return any("threading.py" in f and "_bootstrap" in f for f in frames)

    for pick in (outermost_is_module, lambda f: f and not started_by_threading(f), bool):
        found = [b for b in blocks if pick(b[1])]
        if found:
            return max(found, key=lambda b: len(b[1]))
    return blocks[-1] if blocks else None


def unknown_record(reason: str, *, backend: str | None = None) -> FailureRecord:
    return FailureRecord(stage="unknown", message=reason, backend=backend)


#: The exception a custom op's stand-in raises for inputs no recorded call had (``codec.stand_ins``).
STAND_IN_MISS = "StandInMiss"


def is_stand_in_miss(record: FailureRecord | None) -> bool:
    """Whether ``record`` is a stand-in's miss: the replay's own failure (it could not run the
    op), never the program's."""
    return record is not None and record.exception_type.rpartition(".")[2] == STAND_IN_MISS


def same_failure(recorded: FailureRecord | None, observed: FailureRecord | None) -> bool:
    """True when ``observed`` is the failure that ``recorded`` describes (``same_failure_as``: the
    rule the exported scripts judge by too)."""
    if observed is None or recorded is None:
        return False
    return same_failure_as((recorded.stage, recorded.exception_type, recorded.signature),
                           (observed.stage, observed.signature))


