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


def test_the_names_made_private_still_resolve_with_a_warning():
    """The command line's helpers left the API; code written against them keeps working, warned."""
    import pytest

    from reproarchive import _internal

    assert not set(_internal.HELPERS) & set(reproarchive.__all__)
    for name in _internal.HELPERS:
        with pytest.warns(DeprecationWarning, match=rf"reproarchive\.{name} is private"):
            assert getattr(reproarchive, name) is getattr(_internal, name)
