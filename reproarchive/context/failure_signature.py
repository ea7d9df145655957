"""A failure's signature, and whether two signatures are one failure: the rule ``run`` judges a
replay by (``context.failure``), bundled whole into the scripts ``export`` writes
(``standalone.shared_blocks``), so a ``repro.py`` that fails says "reproduced" or "a different failure"
exactly when ``run`` would. It imports the standard library only
(``tests/standalone/test_bundled_code.py`` keeps it so).
"""

from __future__ import annotations

import re

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


_REMOTE_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)):\s?(.*)$")


def _subprocess_exception(core: BaseException, text: str) -> tuple[str, str] | None:
    """(type, message) of the exception inductor's compile workers raised, which the parent
    re-raises as a ``SubprocException`` whose message is the worker's traceback: the same bug
    compiled in-process (a replay, or another machine's settings) raises that exception itself,
    so the signature is taken from it."""
    if type(core).__name__ != "SubprocException":
        return None
    lines = text.strip().splitlines()
    frames = [k for k, line in enumerate(lines) if line.startswith("  File ")]
    for k in range(frames[-1] + 1 if frames else 0, len(lines)):
        m = _REMOTE_LINE.match(lines[k])  # the first unindented "Type: message" after the last frame
        if m:
            return m.group(1), "\n".join([m.group(2), *lines[k + 1:]]).strip()
    return None


DIAGNOSTIC_MARK = "|diag:"


def signature(stage: str, exc_type: str, message: str, diagnostic: str = "") -> str:
    """``stage|type|normalised first line``, and for a compiler's error the normalised first
    diagnostic after ``|diag:``: every C++ compile error's first line is "C++ compile error",
    so without it any two would count as the same failure."""
    base = f"{stage}|{exc_type}|{normalise_message(message)}"
    return f"{base}{DIAGNOSTIC_MARK}{normalise_message(diagnostic)}" if diagnostic else base


def signature_of(exc: BaseException, stage: str) -> tuple[str, str, list[str], str]:
    """(exception type, message, compiler diagnostics, signature) of ``exc`` raised at ``stage``:
    taken from the exception that names the bug (``innermost``), or from the compile worker's
    own exception where inductor re-raised it (``_subprocess_exception``)."""
    core = innermost(exc)
    exc_type = exception_type_name(core)
    full = str(core)
    remote = _subprocess_exception(core, full)
    if remote is not None:  # the same bug as an in-process compile reports it
        exc_type, full = remote
    diagnostics = compiler_diagnostics(full)
    return exc_type, full, diagnostics, signature(stage, exc_type, full, diagnostics[0] if diagnostics else "")


#: A fault on the device, by class, in the CUDA runtime's words (``cudaGetErrorString``; HIP's
#: alike) however torch or Triton raise it ("CUDA error: ...", "Triton Error [CUDA]: ...").
#: One fault surfaces under several codes: an out-of-bounds access is "an illegal memory
#: access" (700) or "unspecified launch failure" (719) by where the kernel met it, so a replay
#: is judged by the class, never the code. First match wins.
DEVICE_FAULTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("device assert", re.compile(r"device-side assert", re.IGNORECASE)),
    ("illegal address", re.compile(r"illegal memory access|illegal address|misaligned address|"
                                   r"unspecified launch failure|memory access fault", re.IGNORECASE)),
    ("illegal instruction", re.compile(r"illegal instruction was encountered", re.IGNORECASE)),
    ("launch failure", re.compile(r"too many resources requested for launch|invalid configuration argument|"
                                  r"launch timed out|launch out of resources|invalid device function|"
                                  r"no kernel image is available", re.IGNORECASE)),
)
#: where a device error is said: torch ("CUDA error: ", "HIP error: ", torch.AcceleratorError) or Triton
_FROM_DEVICE = re.compile(r"\b(?:CUDA|HIP)(?: error|\]|Error)|AcceleratorError|Triton Error", re.IGNORECASE)
#: the stages a fault is reported in: a kernel's fault is reported by a later call on the device
#: (asynchronous), so one recorded in the forward may surface in the backward's first sync
_RUN_STAGES = ("forward", "backward")


def device_fault(signed: str) -> str | None:
    """The class of device fault (``DEVICE_FAULTS``) a failure's signature says, or None."""
    stage, _, rest = signed.partition("|")
    if stage not in _RUN_STAGES or not _FROM_DEVICE.search(rest):
        return None
    return next((name for name, words in DEVICE_FAULTS if words.search(rest)), None)


def same_failure_as(recorded: tuple[str, str, str], seen: tuple[str, str]) -> bool:
    """Whether a failure seen (stage, signature) is the recorded one (stage, exception type,
    signature). An unknown recorded failure matches any failure of a known stage, because the
    archive never knew more than "it failed"; a crash recorded without its signal (written
    before the process died) matches a crash by any signal, for the same reason. A type recorded
    without its module (a TORCH_TRACE log names ``CppCompileError``, not
    ``torch._inductor.exc.CppCompileError``) matches the observed type of that name; an archive
    recorded before diagnostics were signed knows less, and matches on the rest."""
    stage, exc_type, signed = recorded
    seen_stage, seen_signed = seen
    if stage == "unknown":
        return seen_stage != "unknown"
    if stage == "crash" and not exc_type:
        return seen_stage == "crash"  # written before the crash, the signal unknown
    if not signed:
        return False
    fault = device_fault(signed)
    if fault is not None:  # by its class, reported in either run stage (``_RUN_STAGES``)
        return seen_stage in _RUN_STAGES and device_fault(seen_signed) == fault
    if exc_type and "." not in exc_type:
        seen_signed = _unqualified(seen_signed)
    return signed == seen_signed or (DIAGNOSTIC_MARK not in signed and seen_signed.startswith(signed + DIAGNOSTIC_MARK))


#: A collective that waited past its timeout, in torch.distributed's words (gloo: "Timed out waiting
#: 5000ms for recv operation to complete"; NCCL's watchdog: "Watchdog caught collective operation
#: timeout"), raised as one of torch.distributed's ``Dist*Error``s or naming its backend.
_TIMED_OUT = re.compile(r"timed out|timeout", re.IGNORECASE)
_FROM_COLLECTIVE = re.compile(r"gloo|nccl|c10d|collective|\bDist\w*Error\b", re.IGNORECASE)
#: the stages a collective runs in: while the graph compiles (inductor's cross-rank decisions) or runs
_COLLECTIVE_STAGES = ("compile", "forward", "backward")


def timeout_signature(stage: str, exc_type: str, message: str, signed: str) -> tuple[str, str]:
    """(stage, signature) of a failure, as a ``timeout`` (spec §8 ``failure.stage``) when its
    error is a collective that waited past its timeout. The one rule for a hang: a capture
    records a rank's failure by it and a replay (``run``, an exported job script) judges what it
    observed by it, so they agree on what a timeout is."""
    if stage not in _COLLECTIVE_STAGES or not _TIMED_OUT.search(message) \
            or not _FROM_COLLECTIVE.search(f"{exc_type} {message}"):
        return stage, signed
    prefix = f"{stage}|"
    if signed.startswith(prefix):  # keep the rest (a compiler diagnostic) as it was
        return "timeout", f"timeout|{signed[len(prefix):]}"
    return "timeout", signature("timeout", exc_type, message)


def _unqualified(signature_text: str) -> str:
    """``signature_text`` with its exception type's module left out."""
    stage, sep, rest = signature_text.partition("|")
    exc_type, sep2, tail = rest.partition("|")
    return f"{stage}{sep}{exc_type.rpartition('.')[2]}{sep2}{tail}" if sep else signature_text


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
