"""docs/results.md is generated from the benchmarks' JSON (`sakura bench results`): the committed
page is what the committed JSON gives, its figures are the JSON's, and a missing or changed file
is named on the page instead of a stale table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from sakura.bench.results import DECODE_RATES_REL, SECTIONS, render
from sakura.cli.main import app

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_committed_page_is_the_generated_one():
    text, problems = render(DOCS)
    assert problems == [], problems
    assert (DOCS / "results.md").read_text() == text, "docs/results.md is stale: run ./dev sakura bench results"
    res = CliRunner().invoke(app, ["bench", "results", "--docs", str(DOCS), "--check"])
    assert res.exit_code == 0, res.output


def test_figures_are_read_from_the_json():
    text, _ = render(DOCS)
    dec = json.loads((DOCS / DECODE_RATES_REL).read_text())["targets"]
    assert f"phone-class **{dec['phone']['scaling']['speedup_by_workers']['2']:.2f}x**" in text
    row = next(r for r in dec["host"]["rows"] if r["rendition"] == "progressive#0" and r["workers"] == 1)
    ph = next(r for r in dec["phone"]["rows"] if r["rendition"] == "progressive#0" and r["workers"] == 1
              and r["tokens"] == row["tokens"])
    assert (f"| `progressive#0` | {row['tokens']} | {row['bits_per_value']:.2f} | {row['fp16_bytes_per_cpu_s'] / 1e6:.0f} "
            f"| {ph['fp16_bytes_per_cpu_s'] / 1e6:.0f} |") in text
    for r in json.loads((DOCS / "e2e" / "link.json").read_text())["rows"]:
        assert f"({r['estimate_error'] * 100:+.1f} %)" in text
    faults = json.loads((DOCS / "faults" / "faults.json").read_text())["rows"]
    assert all(f"| {r['fault']} | {r['latency_s'] * 1e3:.0f} ms |" in text for r in faults)
    prof = json.loads((DOCS / "e2e" / "e2e_profile.json").read_text())
    s = prof["summary"][f"style3x1024-out512 | {prof['phones'][1]['name']} | umn_5gophers"]
    assert f"{s['speedup_vs_on-device']['median']:.2f}x ({s['ceiling_vs_on_device']:.2f})" in text
    assert f"{len(prof['runs']):,} runs" in text
    for sec in SECTIONS:  # every table says how to reproduce it
        assert f"## {sec.title}\n\nReproduce: `{sec.command}`" in text


def test_missing_and_changed_json_are_named_not_rendered(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs, ignore=shutil.ignore_patterns("*.png", "*.html", "eval", "compress-*"))
    rates = docs / DECODE_RATES_REL   # the shipped calibration, beside the copied docs/
    rates.parent.mkdir(parents=True)
    (docs / "e2e" / "link.json").unlink()
    d = json.loads((DOCS / DECODE_RATES_REL).read_text())
    del d["targets"]
    rates.write_text(json.dumps(d))
    text, problems = render(docs)
    assert set(problems) == {"Link check (live)", "Decode rates (live)"}
    assert "Not measured yet: docs/e2e/link.json missing" in text
    assert f"Could not read docs/{DECODE_RATES_REL}: KeyError" in text
    res = CliRunner().invoke(app, ["bench", "results", "--docs", str(docs), "--check"])
    assert res.exit_code == 1 and "stale" in res.output  # the copied page came from the full JSON
