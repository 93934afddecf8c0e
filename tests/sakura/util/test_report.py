"""`sakura.util.report`: the report logger and table writer every wing uses (the benchmark harness
re-exports them); the quality table of the task library and the training cards are written by it."""

import logging

from sakura.util.report import report_logger, set_verbosity


def test_a_wing_s_report_lines_reach_stdout_once_and_plain(capsys):
    root = logging.getLogger()
    seen: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    catch = Catch()
    root.addHandler(catch)
    try:
        log = report_logger("sakura.cloud.example.mod", root="sakura.cloud.example")
        log.info("built %s", "look-00")
        assert capsys.readouterr().out == "built look-00\n"
        assert seen == []  # the root logger (a server's basicConfig) does not print it a second time
        # a name outside the root is put under it, so a caller cannot miss the handler by a typo
        assert report_logger("elsewhere", root="sakura.cloud.example").name == "sakura.cloud.example.elsewhere"
        set_verbosity("sakura.cloud.example", quiet=True)
        log.info("hidden")
        log.warning("shown")
        assert capsys.readouterr().out == "shown\n"
    finally:
        root.removeHandler(catch)
        set_verbosity("sakura.cloud.example", quiet=False)


def test_the_quality_table_is_written_by_the_one_writer():
    from types import SimpleNamespace

    from sakura.cloud.tasks.quality import QualityReport

    t = SimpleNamespace(task="sticker", psnr={"model": 30.0, "identity": 20.0, "swapped": 18.0},
                        ssim={"model": 0.9, "identity": 0.8, "swapped": 0.7}, gain_db=10.0,
                        psnr_region={"model": 28.0, "identity": 15.0, "swapped": 14.0}, gain_region_db=13.0)
    md = QualityReport.markdown(SimpleNamespace(tasks=[t]))
    head, sep, *rows = md.splitlines()
    assert sep == "| " + " | ".join(["---"] * 8) + " |"   # derived from the header: 8 columns
    assert rows[1] == "| sticker (in region) | 28.00 | 15.00 | 14.00 |  |  |  | +13.00 dB |"
    assert head.startswith("| task | model PSNR |") and len(rows) == 2
