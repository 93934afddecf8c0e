"""Run the docstring examples (known answers) of the saeot modules."""

import doctest
import importlib

import pytest


@pytest.mark.parametrize("name", ["distributions", "wasserstein", "matching", "sae", "stats", "api"])
def test_doctests(name):
    mod = importlib.import_module(f"saeot.{name}")
    res = doctest.testmod(mod)
    assert res.attempted > 0 and res.failed == 0
