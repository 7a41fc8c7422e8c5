"""Fixtures several unit-test modules share."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    """Code under test configures the root logger; later tests must not inherit its handlers
    (one may write to a capture that is closed by then) or its level."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
