"""The public surface is what docs/api.md lists, no more and no less, and every public name
says what it is for: a name added without a line there, or a line left for a removed name,
fails here."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import reproarchive

PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def _documented() -> list[str]:
    return re.findall(r"^- `(\w+)` — ", PAGE.read_text(), flags=re.M)


def test_the_page_lists_exactly_the_public_names():
    documented = _documented()
    assert len(documented) == len(set(documented)), "a name is listed twice"
    assert sorted(documented) == sorted(reproarchive.__all__)


def test_every_public_name_resolves_and_has_a_docstring():
    for name in reproarchive.__all__:
        value = getattr(reproarchive, name)
        assert (inspect.getdoc(value) or "").strip(), f"reproarchive.{name} has no docstring"
