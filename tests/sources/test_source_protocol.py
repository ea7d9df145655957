"""Every capture source module declares the ``Source`` protocol, and writes through the one writer."""

from __future__ import annotations

import ast
import importlib
import inspect

import pytest

from reproarchive.format import schema
from reproarchive.sources.source import SOURCE_MODULES, Source


@pytest.mark.parametrize("name", SOURCE_MODULES)
def test_each_source_module_is_a_source(name):
    module = importlib.import_module(name)
    assert isinstance(module, Source)
    assert module.SOURCE_RECORD in typing_args(schema.Source)


@pytest.mark.parametrize("name", SOURCE_MODULES)
def test_no_source_packs_or_redacts_by_hand(name):
    """The records go through ``archive.writing.write_capture``: no source calls ``pack`` or the
    redaction itself."""
    called = _calls(name)
    if name.endswith("backend"):  # with the module that writes its archives
        called |= _calls("reproarchive.sources.capture.failure_archives")
    assert not called & {"pack", "redacted_records"}, name
    if name.endswith("backend"):  # the backend writes through failure_records.write_archive
        assert "write_archive" in called and "write_capture" in _calls("reproarchive.sources.capture.failure_records")
    else:
        assert "write_capture" in called, name


def _calls(module: str) -> set[str]:
    tree = ast.parse(inspect.getsource(importlib.import_module(module)))
    return {node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            for node in ast.walk(tree) if isinstance(node, ast.Call)}


def typing_args(tp) -> tuple:
    import typing

    return typing.get_args(typing.get_args(tp)[0])
