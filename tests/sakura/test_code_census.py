"""Issue 43's rules on imports and function length, kept by `scripts/code_census.py` (ast only)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("code_census", ROOT / "scripts" / "code_census.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def census():
    mod = _script()
    return mod, mod.census()  # ~2 CPU-s: every source file parsed once for the module


def test_no_function_level_import_from_its_own_wing_and_every_one_says_why(census):
    mod, c = census
    same = [f"{i['where']} {i['function']}: {i['imports']}" for i in c["_imports"] if i["same_wing"]]
    assert same == [], "import these at module top (a lazy facade where the path must stay light: docs/structure.md)"
    unexplained = [i["where"] for i in c["_imports"] if not i["reason"]]
    assert unexplained == [], "a function-level import carries `# lazy: <reason>` (docs/harness.md)"
    assert c["function_level_imports"] <= mod.TARGET_FUNCTION_LEVEL


def test_no_sakura_function_over_150_lines(census):
    _mod, c = census
    long = [f for f in c["longest_functions"] if f["lines"] > 150 and not f["exempt"] and "src/sakura/" in f["where"]]
    assert long == []


def test_the_census_sees_what_it_counts(tmp_path):
    """The counters find a same-wing function-level import, a log=print parameter and a separator."""
    mod = _script()
    pkg = tmp_path / "src" / "sakura" / "phone"
    pkg.mkdir(parents=True)
    (tmp_path / "src" / "saeot").mkdir()
    (pkg / "x.py").write_text('def f(log=print):\n    from sakura.phone import y\n    return "|---|---|"\n')
    mod.ROOT = tmp_path
    c = mod.census(tmp_path / "src")
    assert (c["function_level_same_wing"], c["log_print_parameters"], c["hand_written_separators"]) == (1, 1, 1)
    assert c["function_level_without_lazy_reason"] == 1
