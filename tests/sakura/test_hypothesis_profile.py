"""The hypothesis profile tests/conftest.py loads: derandomised in CI, exploring locally."""

import runpy
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
REPO = CONFTEST.parents[1]


def _draws(profile: str) -> list[int]:
    """The examples one property draws under a profile (a fresh run of the same test)."""
    seen: list[int] = []

    @settings(settings.get_profile(profile), max_examples=20)
    @given(st.integers(0, 2**62))
    def prop(x):
        seen.append(x)

    prop()
    return seen


def test_ci_profile_draws_the_same_examples_every_run_and_dev_explores():
    assert settings.get_profile("ci").database is None
    assert _draws("ci") == _draws("ci")
    assert _draws("dev") != _draws("dev")  # 2**62 values: equal runs would be a broken profile


@pytest.mark.parametrize("env, profile", [
    ({}, "dev"),
    ({"CI": "true"}, "ci"),
    ({"CI": "1"}, "ci"),
    ({"CI": "false"}, "dev"),
    ({"HYPOTHESIS_PROFILE": "ci"}, "ci"),
    ({"HYPOTHESIS_PROFILE": "dev", "CI": "true"}, "dev"),   # explicit beats the CI variable
])
def test_conftest_loads_the_profile_the_environment_asks_for(monkeypatch, env, profile):
    before = settings.default
    for k in ("CI", "HYPOTHESIS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    try:
        runpy.run_path(str(CONFTEST))  # what pytest does at start-up
        assert settings.default.derandomize is (profile == "ci")
    finally:
        settings.load_profile("ci" if before.derandomize else "dev")


def test_ci_script_selects_the_ci_profile():
    lines = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines()]
    assert "export HYPOTHESIS_PROFILE=ci" in lines
    assert lines.index("export HYPOTHESIS_PROFILE=ci") < next(i for i, ln in enumerate(lines) if ln.startswith("./dev test"))
