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

from reproarchive.format.schema import STAGES, AccuracyReport, FailureRecord

# Order matters: paths and addresses are masked before plain numbers eat their digits.
_MASKS: list[tuple[re.Pattern[str], str]] = [
    # A failed compiler subprocess quotes its whole argv, which differs between machines.
    (re.compile(r"Command '\[.*?\]'"), "Command <argv>"),
    (re.compile(r"(?:[A-Za-z]:)?(?:/[\w.\-+@~]+)+/?"), "<path>"),
    (re.compile(r"0x[0-9a-fA-F]+"), "<addr>"),
    (re.compile(r"\b[0-9a-f]{16,}\b"), "<hex>"),
    # FX / inductor generated names: add_3, buf12, arg0_1, primals_2, tmp4, s77, u0, x0 ...
    # (dtype names such as float16 / int64 are kept: they tell failures apart)
    (re.compile(r"\b(?!(?:b?float|u?int|complex|qu?int)\d+\b)([A-Za-z_]+?)_?\d+(?:_\d+)*\b"), r"\1<n>"),
    (re.compile(r"(?<![A-Za-z0-9_.])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"), "<num>"),
    (re.compile(r"\s+"), " "),
]

#: What each stage is called in a report.
KIND_BY_STAGE = {
    "compile": "compile error",
    "forward": "runtime error (forward)",
    "backward": "runtime error (backward)",
    "accuracy": "accuracy failure",
    "crash": "crash",
    "unknown": "unknown failure",
}


def failure_kind(record: FailureRecord | None) -> str:
    """"passed" for no failure, else the kind of failure ("compile error", "crash", ...)."""
    return "passed" if record is None else KIND_BY_STAGE.get(record.stage, "unknown failure")


MAX_MESSAGE_CHARS = 4000
MAX_TRACEBACK_CHARS = 20000


def normalise_message(message: str) -> str:
    """Mask run-specific detail; keep only the first line that carries meaning.

    Inductor wraps the real error in several lines of boilerplate; the first non-empty line
    of the innermost message is what identifies the bug, the rest is advice text that changes
    between torch versions.
    """
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    for pattern, repl in _MASKS:
        text = pattern.sub(repl, text)
    return text.strip()[:500]


def exception_type_name(exc: BaseException | type) -> str:
    cls = exc if isinstance(exc, type) else type(exc)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


# Exceptions torch raises around a backend's own error; their message is boilerplate.
WRAPPERS = {"BackendCompilerFailed", "InductorError", "TorchRuntimeError", "InternalTorchDynamoError"}


def innermost(exc: BaseException) -> BaseException:
    """The exception that names the bug, not the wrappers torch adds around it.

    torch.compile re-raises backend errors as BackendCompilerFailed / InductorError with the
    original as ``inner_exception`` or ``__cause__``; two runs of the same bug can differ in
    wrapping (with and without Dynamo), so the signature is taken from the core. Only known
    wrappers are unwrapped: a CppCompileError caused by a CalledProcessError stays a
    CppCompileError, whose identity does not depend on the compiler's command line.
    """
    seen = set()
    while id(exc) not in seen and type(exc).__name__ in WRAPPERS:
        seen.add(id(exc))
        inner = getattr(exc, "inner_exception", None) or exc.__cause__
        if not isinstance(inner, BaseException):
            break
        exc = inner
    return exc


def signature(stage: str, exc_type: str, message: str) -> str:
    return f"{stage}|{exc_type}|{normalise_message(message)}"


def record_from_exception(exc: BaseException, stage: str, *, backend: str | None = None) -> FailureRecord:
    """Build the failure record for an exception raised while compiling or running a graph."""
    if stage not in STAGES:
        raise ValueError(f"unknown failure stage {stage!r}")
    core = innermost(exc)
    exc_type = exception_type_name(core)
    message = str(core)[:MAX_MESSAGE_CHARS]
    tb = "".join(_traceback.format_exception(type(exc), exc, exc.__traceback__))
    return FailureRecord(stage=stage, exception_type=exc_type, message=message, traceback=tb[-MAX_TRACEBACK_CHARS:],
                         signature=signature(stage, exc_type, message), backend=backend)


def without_machine_paths(record: FailureRecord, prefixes: dict[str, str] | None = None) -> FailureRecord:
    """The record with this machine's paths replaced in its message and traceback (home,
    Python, site-packages, caches, the temporary folder, and ``prefixes``). The signature stays
    as it is: it masks every path already, so it matches replays on other machines."""
    from reproarchive.context.redaction import machine_prefixes, redact_paths

    table = {**machine_prefixes(), **(prefixes or {})}
    return dataclasses.replace(record, message=redact_paths(record.message, table),
                               traceback=redact_paths(record.traceback, table))


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
    status). The signature is the signal alone: the crash site's output varies run to run."""
    return FailureRecord(stage="crash", exception_type=name, message=message, traceback=output[-MAX_TRACEBACK_CHARS:],
                         signature=signature("crash", name, ""), backend=backend)


def unknown_record(reason: str, *, backend: str | None = None) -> FailureRecord:
    return FailureRecord(stage="unknown", message=reason, backend=backend)


def same_failure(recorded: FailureRecord | None, observed: FailureRecord | None) -> bool:
    """True when ``observed`` is the failure that ``recorded`` describes.

    An unknown recorded failure matches any failure of the same stage class, because the
    archive never knew more than "it failed".
    """
    if observed is None or recorded is None:
        return False
    if recorded.stage == "unknown":
        return observed.stage != "unknown"
    return bool(recorded.signature) and recorded.signature == observed.signature


# A line in which a compiler reports an error (not a warning or a note): g++/clang/nvcc
# "file:line:col: error: ...", nvcc/MSVC "file(line): error ...", ptxas, LLVM, and the header of
# Triton's CompilationError ("at 12:4:"), whose quoted source lines follow it.
_DIAGNOSTIC = re.compile(
    r"^(?:[^\s:]+:\d+:(?:\d+:)? (?:fatal )?error\b"
    r"|[^\s(]+\(\d+\): (?:fatal )?error\b"
    r"|(?:nvcc |ptxas )?(?:fatal|error)(?: \w+)?: "
    r"|ptxas (?:fatal|error)\b"
    r"|LLVM ERROR: "
    r"|(?:[\w.]+\.)?CompilationError: at \d+:\d+:"
    r"|at \d+:\d+:$)"
)
_TRITON_HEADER = re.compile(r"(?:^|\.|\s)CompilationError: at \d+:\d+:$|^at \d+:\d+:$")
MAX_DIAGNOSTICS = 20
_TRITON_CONTEXT_LINES = 8


def compiler_diagnostics(text: str, limit: int = MAX_DIAGNOSTICS) -> list[str]:
    """The error lines a compiler printed, in order and in full, without its warnings and notes.

    A C++ compile error from Inductor quotes the whole compiler output, often thousands of
    warning lines before the one that matters; this keeps only the lines that say "error"
    the way g++/clang/nvcc/ptxas/LLVM say it. For Triton's CompilationError the quoted kernel
    lines after the "at L:C:" header are kept as well (up to a blank line), because the header
    alone does not say what failed.
    """
    out: list[str] = []
    lines = str(text).splitlines()
    i = 0
    while i < len(lines) and len(out) < limit:
        line = lines[i].rstrip()
        stripped = line.strip()
        if stripped and _DIAGNOSTIC.match(stripped):
            out.append(stripped)
            if _TRITON_HEADER.search(stripped):
                for follow in lines[i + 1:i + 1 + _TRITON_CONTEXT_LINES]:
                    if not follow.strip() or len(out) >= limit:
                        break
                    out.append(follow.rstrip())
                    i += 1
        i += 1
    return out
