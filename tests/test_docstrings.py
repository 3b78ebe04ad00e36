"""The docstrings' examples run and print what they say (on the CPU backend)."""

from __future__ import annotations

import doctest

import pytest

import portable_softmax
from portable_softmax import api, planner, reference


@pytest.mark.parametrize("module", [portable_softmax, api, planner, reference], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    with portable_softmax.use_backend("cpu"):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
