"""Fixtures shared by every test folder (helpers live in tests/support/)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def fresh_dynamo():
    """A test that compiles starts and ends with an empty Dynamo cache."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
