"""Where a capture's archive went, told on the user's own exception: in its message (Dynamo
rebuilds ``BackendCompilerFailed``'s message from the inner exception's), a note and an
attribute; and found again through torch's wrappers (``archive_path``)."""

from __future__ import annotations

from pathlib import Path


def annotate(exc: BaseException, path: Path | None, error: str | None, when: str = "") -> None:
    """Make the archive path visible wherever the exception is shown.

    Dynamo re-raises a backend's exception inside ``BackendCompilerFailed`` whose message is
    built from ``str(inner)`` and shortens tracebacks, so a note alone can be lost: the path
    goes into the message itself (first string argument), and also into a note and an
    attribute. The exception keeps its type and traceback. ``when``: where the archive is
    written later than now (a job's, moved to its place when the job ends).
    """
    line = f"[reproarchive] archive written to {path}{when}" if path else f"[reproarchive] no archive written: {error}"
    try:
        exc.reproarchive_path = str(path) if path else None  # type: ignore[attr-defined]
    except Exception:
        pass
    try:
        if exc.args and isinstance(exc.args[0], str):
            exc.args = (f"{exc.args[0]}\n{line}", *exc.args[1:])
        elif not exc.args:
            exc.args = (line,)
    except Exception:
        pass
    if line not in str(exc) and hasattr(exc, "add_note"):  # a custom __str__ ignored args
        exc.add_note(line)


def archive_path(exc: BaseException) -> str | None:
    """The archive a capture backend wrote for ``exc``, looking through the wrappers torch
    adds (``BackendCompilerFailed.inner_exception``, ``__cause__``, ``__context__``)."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        found = getattr(e, "reproarchive_path", None)
        if found:
            return found
        todo.extend(x for x in (getattr(e, "inner_exception", None), e.__cause__, e.__context__)
                    if isinstance(x, BaseException))
    return None
