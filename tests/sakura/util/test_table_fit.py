"""Tables fit the terminal (issue 45: `templates` and `store stats` printed 164-166 columns whatever
the terminal), and a piped table stays whole for the script that reads it."""

from sakura.util.text import fit_to_terminal


def test_long_rows_are_cut_to_the_width_and_marked():
    table = "id     bytes  thumbnail\n" + "look-00  1234  http://127.0.0.1:8080/" + "x" * 150
    out = fit_to_terminal(table, width=80).splitlines()
    assert out[0] == "id     bytes  thumbnail" and len(out[1]) == 80 and out[1].endswith("~")


def test_piped_output_is_left_whole(capsys):
    long = "x" * 300
    assert fit_to_terminal(long) == long  # pytest's stdout is not a terminal
