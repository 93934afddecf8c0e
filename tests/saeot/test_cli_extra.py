"""saeot without its [saeot] extra: one line naming the extra, exit status 2, nothing run."""
from typer.testing import CliRunner

import saeot.cli as cli


def test_missing_extra_is_one_line_naming_it(monkeypatch, tmp_path):
    # a distribution that is really not installed stands for a missing extra module
    monkeypatch.setitem(cli._EXTRA_MODULES, "saeot_no_such_module_for_test", "no-such-dist")
    res = CliRunner().invoke(cli.app, ["demo", "--out", str(tmp_path / "out")])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "pip install '.[saeot]'" in lines[0] and "no-such-dist" in lines[0]
    assert not (tmp_path / "out").exists()


def test_installed_extra_passes_the_check():
    res = CliRunner().invoke(cli.app, ["demo", "--help"])
    assert res.exit_code == 0 and "saeot needs its extra" not in res.output
