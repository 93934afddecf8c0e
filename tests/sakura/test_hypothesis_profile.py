"""The hypothesis profile tests/conftest.py loads: derandomised in CI, exploring locally."""

import os

from hypothesis import settings


def test_ci_profile_is_derandomised_without_a_database():
    ci = settings.get_profile("ci")
    assert ci.derandomize is True and ci.database is None
    assert settings.get_profile("dev").derandomize is False


def test_the_loaded_profile_follows_the_ci_variable():
    expect_ci = (os.environ.get("HYPOTHESIS_PROFILE") == "ci"
                 or (not os.environ.get("HYPOTHESIS_PROFILE") and os.environ.get("CI", "").lower() in ("true", "1")))
    assert settings.default.derandomize is expect_ci
