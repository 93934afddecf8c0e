"""docs/structure.md's duplicates list is generated (scripts/structure_duplicates.py) and current:
a change that adds a pair of duplicated places, or removes one, regenerates the list (and says
why a new pair stays) or this fails."""

import importlib.util
import shutil
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "structure_duplicates.py"


def test_the_duplicates_list_in_structure_md_is_current():
    if shutil.which("duplicates") is None:
        pytest.skip("the `duplicates` command is not on PATH here (it is a developer tool, not a dependency)")
    spec = importlib.util.spec_from_file_location("structure_duplicates", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        pairs = mod.scan()
    except mod.ScanIncomplete as e:
        pytest.skip(f"the scan did not finish on this machine: {e}")
    page = mod.PAGE.read_text()
    assert mod.page_with(mod.render(pairs), page) == page, "stale: run python scripts/structure_duplicates.py"
    assert pairs, "the scan found nothing: the command's output format changed?"
