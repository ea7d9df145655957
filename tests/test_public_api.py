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


def _documented_errors() -> list[str]:
    return re.findall(r"^- `errors\.(\w+)` — ", PAGE.read_text(), flags=re.M)


def test_the_page_lists_exactly_the_public_errors_and_each_says_what_it_is():
    from reproarchive import errors

    documented = _documented_errors()
    # the base class is listed once, as a name of the package
    assert len(documented) == len(set(documented))
    assert sorted([*documented, "ReproArchiveError"]) == sorted(errors.__all__)
    for name in errors.__all__:
        assert (inspect.getdoc(getattr(errors, name)) or "").strip(), f"reproarchive.errors.{name} has no docstring"
    assert set(errors.__all__) & set(reproarchive.__all__) == {"ReproArchiveError"}


def test_the_errors_that_left_the_package_still_resolve_with_a_warning():
    """Code that caught ``reproarchive.PackError`` keeps working, warned where the class lives now."""
    import pytest

    from reproarchive import errors

    for name in set(errors.__all__) - set(reproarchive.__all__):
        with pytest.warns(DeprecationWarning, match=rf"reproarchive\.{name} is reproarchive\.errors\.{name} now"):
            assert getattr(reproarchive, name) is getattr(errors, name)
