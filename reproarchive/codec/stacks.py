"""A node's source stack (Dynamo's ``stack_trace``) <-> the frames an archive keeps (spec §7.1, 1.7).

Dynamo gives each node the user frames it was traced at, printed as Python's traceback prints
them; AOTAutograd carries them onto the nodes it makes. A backend reads them (Inductor names
them in its errors: "While executing ... Original traceback"), FX prints the innermost one above
each line of the code it generates, and people read them to find the model line a node came
from. The archive keeps them as frames, each stack once per graph, with this machine's paths
redacted as records are; a replay gives every node back the text Dynamo gave it (the redacted
paths aside).
"""

from __future__ import annotations

import re
from typing import Callable

from reproarchive.format.schema import MAX_FRAME_TEXT, MAX_STACK_FRAMES, StackFrame
from reproarchive.format.schema.rules.names import LINE_BREAKING

Stack = tuple[StackFrame, ...]  # outermost frame first

_FRAME = re.compile(r'^ *File "(.*)", line (\d+), in (.*)$')  # FX's own tracer writes the first unindented
_MARKS = re.compile(r"^ *[\^~][ \^~]*$")
_ABSOLUTE = re.compile(r"^(?:/|[A-Za-z]:[\\/]|\\\\)")

#: The frame in FX's comment above the code a frame traced (``# File: ./m.py:12 in forward, code:
#: y = self.lin(x)``, its innermost), as a pattern to put after ``# File: ``; and the comment
#: above nodes without a stack. What packing redacts and a log or dump import reads.
SOURCE_FRAME = r"(?P<file>.+?):(?P<line>\d+) in (?P<name>.+?), code: (?P<code>.*)"
NO_STACK_COMMENT = "# No stacktrace found for following nodes"


def parse_stack(text: str | None, paths: Callable[[str], str] = str) -> Stack | None:
    """The frames of a printed stack (outermost first), each file and code line passed through
    ``paths`` (the writer's redaction); None when ``text`` holds no frame. Lines that are not
    part of a frame (a "Traceback" header) are left out."""
    if not isinstance(text, str) or not text:
        return None
    frames: list[dict] = []
    for line in text.split("\n"):
        found = _FRAME.match(line)
        if found:
            frames.append({"file": file_as_kept(found[1], paths), "line": int(found[2]), "name": found[3]})
        elif frames and line.startswith("    ") and "code" not in frames[-1]:
            frames[-1]["code"] = paths(line[4:])
        elif frames and "code" in frames[-1] and "marks" not in frames[-1] and _MARKS.match(line):
            frames[-1]["marks"] = line
    if not frames:
        return None
    return tuple(StackFrame(**{k: _one_line(v) if isinstance(v, str) else v for k, v in f.items()})
                 for f in frames[-MAX_STACK_FRAMES:])


def file_as_kept(path: str, paths: Callable[[str], str] = str) -> str:
    """A file name as an archive keeps it: ``paths`` (the writer's redaction) applied, and what
    that left of an absolute path (a folder it does not know: ``/data/team/model.py``) written
    ``<path>/model.py``, since the folders of this machine are not the archive's to carry (§8)."""
    path = paths(path)
    if _ABSOLUTE.match(path):
        return "<path>/" + re.split(r"[/\\]", path)[-1]
    return path


def _one_line(text: str) -> str:
    """Text a frame may hold (spec R7.1-9): no control character, at most ``MAX_FRAME_TEXT``."""
    return LINE_BREAKING.sub("\ufffd", text)[:MAX_FRAME_TEXT]


def format_stack(stack: Stack) -> str:
    """The frames printed as Dynamo prints a node's ``stack_trace`` (traceback's own layout)."""
    out = []
    for frame in stack:
        out.append(f'  File "{frame.file}", line {frame.line}, in {frame.name}\n')
        if frame.code is not None:
            out.append(f"    {frame.code}\n")
        if frame.marks is not None:
            out.append(f"{frame.marks}\n")
    return "".join(out)


class StackTable:
    """The distinct stacks of one graph, in first-use order: a node stores its stack's index
    (a layer's nodes share one stack; a 10,000-node graph has a few hundred)."""

    def __init__(self, paths: Callable[[str], str] = str):
        self._paths = paths
        self._by_text: dict[str, int | None] = {}
        self.stacks: list[Stack] = []
        self._index: dict[Stack, int] = {}

    def index_of(self, text: str | None) -> int | None:
        if not text:
            return None
        if text not in self._by_text:
            stack = parse_stack(text, self._paths)
            if stack is not None and stack not in self._index:
                self._index[stack] = len(self.stacks)
                self.stacks.append(stack)
            self._by_text[text] = None if stack is None else self._index[stack]
        return self._by_text[text]
