"""A fleet's documents (:mod:`diloco_gym.eval.fleet_render`): the oracle's labels and
sentences, the links' sentence, and the one writer of a fleet's output directories. The
report's and the frontier's whole documents are checked with their runs
(``tests/eval/test_fleet_protocol.py``, ``tests/eval/test_fleet_frontier.py``)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from diloco_gym.eval import fleet
from diloco_gym.eval.fleet_render import (
    FleetFiles,
    links_sentence,
    oracle_label,
    oracle_note,
    write_fleet_dir,
)


def test_the_fleet_module_reexports_its_documents():
    for name in ("write_fleet_report", "write_fleet_dir", "fleet_summary_table", "oracle_label"):
        assert name in fleet.__all__ and callable(getattr(fleet, name))


@pytest.mark.parametrize(
    ("args", "label"),
    [
        ((0.0,), "oracle pp"),
        ((0.0, True), "oracle (uncapped) pp"),
        ((2.5,), "oracle (sum + 2.5 x worst site) pp"),
        ((2.5, True), "oracle (sum + 2.5 x worst site, uncapped) pp"),
        ((2.5, False, True), "oracle (upper bound) pp"),
        ((0.0, True, True), "oracle (upper bound, uncapped) pp"),
    ],
)
def test_the_oracle_column_says_what_the_oracle_is(args, label):
    assert oracle_label(*args) == label


def test_the_oracle_note_is_said_only_with_a_worst_site_weight():
    assert oracle_note(0.0) == "" and oracle_note(0.0, rounds=True) == ""
    assert "not the total it reports" in oracle_note(3.0)
    assert "the total it reports." in oracle_note(3.0, rounds=True)


def test_the_links_sentence_names_traces_levels_or_nothing():
    assert links_sentence({"link_levels": None}) == ""
    traced = links_sentence(
        {
            "link_traces": {"eu|west": "a.csv"},
            "link_trace_tiles": 4,
            "sync_window_s": 8.0,
            "sync_window_slowest_s": 20.5,
        }
    )
    assert "eu\\|west (`a.csv`)" in traced  # a name cannot split a table cell
    assert "tile k mod 4" in traced and "only the first seed of each tile" in traced
    levels = links_sentence(
        {
            "link_levels": [1.0, 0.5],
            "link_probs": [0.75, 0.25],
            "link_dwell_s": 60.0,
            "sync_window_s": 8.0,
            "sync_window_slowest_s": 16.0,
        }
    )
    assert "1, 0.5 of its nominal rate" in levels and "from 8.00 s to 16.00 s" in levels


def test_the_writer_writes_every_file_and_keeps_the_reports_force_rules(tmp_path):
    result = {"fleet": {"file": "f.toml"}, "config": {"seeds": 2}, "calibration_verdict": "ok"}

    def files(body: str) -> FleetFiles:
        return FleetFiles(
            "t.csv",
            pd.DataFrame({"a": [1, 2]}),
            "t.json",
            {"extra": [1]},
            "t.md",
            "Title",
            [body],
            more=lambda tmp: (tmp / "more.txt").write_text("x"),
        )

    out = tmp_path / "out"
    write_fleet_dir(result, out, False, "cmd --x", files("first"))
    payload = json.loads((out / "t.json").read_text())
    assert payload["command"] == "cmd --x" and payload["extra"] == [1]
    assert payload["fleet"] == {"file": "f.toml"} and payload["calibration_verdict"] == "ok"
    assert (out / "t.md").read_text() == "# Title\n\nCommand: `cmd --x`\n\nfirst\n"
    assert pd.read_csv(out / "t.csv")["a"].tolist() == [1, 2]
    assert (out / "more.txt").read_text() == "x"
    with pytest.raises(FileExistsError):
        write_fleet_dir(result, out, False, "", files("second"))
    write_fleet_dir(result, out, True, "", files("second"))  # a report dir: replaced
    assert (out / "t.md").read_text().endswith("second\n")
