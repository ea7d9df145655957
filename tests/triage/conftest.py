"""The fleet corpus (tests/support/fleet_corpus.py), built once per session."""

from __future__ import annotations

import pytest

from support import fleet_corpus


@pytest.fixture(scope="session")
def fleet(tmp_path_factory):
    """200 archives of five seeded bugs (``fleet_corpus.build``; about 15 s on one core)."""
    return fleet_corpus.build(tmp_path_factory.mktemp("fleet"), 200)
