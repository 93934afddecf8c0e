"""The benchmark harness: one table writer (markdown + terminal), logging, atomic output."""

import json

import pytest

from sakura.bench.harness import get_logger, markdown_table, publish, set_verbosity, terminal_table


def test_markdown_table_separator_follows_the_header_and_alignment():
    md = markdown_table(["case", "ms", "note"], [["a", "1.0", "x|y"]], align="lrl")
    head, sep, row = md.splitlines()
    assert head == "| case | ms | note |"
    assert sep == "| --- | ---: | --- |"
    assert row == "| a | 1.0 | x\\|y |"  # a '|' in a cell cannot split the row


def test_a_row_of_the_wrong_width_is_an_error():
    with pytest.raises(ValueError, match="row 0 has 1 cells"):
        markdown_table(["a", "b"], [["only one"]])
    with pytest.raises(ValueError, match="align"):
        terminal_table(["a", "b"], [], align="lrl")
    with pytest.raises(ValueError, match="align"):
        markdown_table(["a", "b"], [], align="x")
    assert markdown_table(["a", "b", "c"], [], align="l").splitlines()[1] == "| --- | --- | --- |"  # one letter: all


def test_terminal_table_fits_the_width():
    rows = [["x" * 80, "1.0", "y" * 60]]
    text = terminal_table(["name", "ms", "what"], rows, align="lrl", width=50)
    assert all(len(line) <= 50 for line in text.splitlines())
    assert "~" in text  # a cut cell says so
    wide = terminal_table(["name", "ms"], [["abc", "1.0"]], width=200)
    assert wide.splitlines() == ["name   ms", "----  ---", "abc   1.0"]


def test_logging_goes_to_stdout_and_can_be_quieted(capsys):
    log = get_logger("sakura.bench.example")
    log.info("hello %d", 3)
    assert capsys.readouterr().out == "hello 3\n"
    set_verbosity(quiet=True)
    try:
        log.info("hidden")
        assert capsys.readouterr().out == ""
    finally:
        set_verbosity(quiet=False)


def test_publish_writes_json_and_markdown(tmp_path):
    res = publish(tmp_path / "o", "thing", {"a": 1}, "| x |")
    assert res == {"a": 1}
    assert json.loads((tmp_path / "o" / "thing.json").read_text()) == {"a": 1}
    assert (tmp_path / "o" / "thing.md").read_text() == "| x |\n"
    assert not list((tmp_path / "o").glob("*.tmp"))
