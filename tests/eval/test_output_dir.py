"""Output directories (:mod:`diloco_gym.eval.output_dir`): ``--force`` replaces only what a
report wrote, the new directory is complete before it replaces the old one, a killed run's
leftovers are cleaned, and a symbolic link is kept (report, frontier and the fleet protocol
share these rules)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from diloco_gym.eval import outlock, report
from diloco_gym.eval import output_dir as od


def _fill(text: str):
    def fill(tmp: Path) -> None:
        (tmp / "report.md").write_text(text)
        (tmp / "results.csv").write_text("a\n1\n")

    return fill


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_the_report_module_re_exports_the_output_directory_rules():
    for name in ("MARKER", "is_report_dir", "clean_leftovers", "prepare_out_dir"):
        assert getattr(report, name) is getattr(od, name)
    assert report.write_output_dir is od.write_output_dir


def test_marker_lists_the_files_written(tmp_path):
    out = tmp_path / "r"
    od.write_output_dir(out, False, _fill("one"))
    marker = (out / od.MARKER).read_text()
    assert marker.splitlines()[-2:] == ["report.md", "results.csv"]
    assert od.is_report_dir(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # no lock file left


def test_force_refuses_a_report_dir_holding_user_files_and_names_them(tmp_path):
    out = tmp_path / "r"
    od.write_output_dir(out, False, _fill("one"))
    (out / "my_notes.md").write_text("mine")
    (out / "mydata").mkdir()
    (out / "mydata" / "x.bin").write_bytes(b"1")
    with pytest.raises(FileExistsError) as err:
        od.write_output_dir(out, True, _fill("two"))
    msg = str(err.value)
    assert "'my_notes.md'" in msg and "'mydata/'" in msg and "no report wrote" in msg
    assert (out / "my_notes.md").read_text() == "mine"
    assert (out / "mydata" / "x.bin").read_bytes() == b"1"
    assert (out / "report.md").read_text() == "one"
    # the user moves them out: the report is replaced
    (out / "my_notes.md").unlink()
    (out / "mydata" / "x.bin").unlink()
    (out / "mydata").mkdir(exist_ok=True)
    (out / "mydata").rmdir()
    od.write_output_dir(out, True, _fill("two"))
    assert (out / "report.md").read_text() == "two"


def test_an_old_marker_without_a_list_accepts_only_report_files(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / od.MARKER).write_text(od._MARKER_TEXT)  # the marker of 0.4.0: no file list
    (out / "report.md").write_text("old")
    (out / "fig_bursty.png").write_bytes(b"png")
    assert od.is_report_dir(out)
    (out / "thesis.tex").write_text("precious")
    assert not od.is_report_dir(out)
    with pytest.raises(FileExistsError, match="'thesis.tex'"):
        od.prepare_out_dir(out, True)
    outlock.release_out_locks()


def test_a_symlinked_output_keeps_the_link_and_replaces_its_target(tmp_path):
    target = tmp_path / "real"
    od.write_output_dir(target, False, _fill("one"))
    link = tmp_path / "link_rep"
    link.symlink_to(target)
    od.write_output_dir(link, True, _fill("two"))
    assert link.is_symlink() and Path(os.readlink(link)) == target
    assert (target / "report.md").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link_rep", "real"]  # nothing stray


def test_an_interrupted_fill_keeps_the_old_output_and_leaves_nothing_beside_it(tmp_path):
    out = tmp_path / "r"
    od.write_output_dir(out, False, _fill("old"))

    def boom(tmp: Path) -> None:
        (tmp / "report.md").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        od.write_output_dir(out, True, boom)
    assert (out / "report.md").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_prepare_refuses_what_force_may_not_replace(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileExistsError, match="the current directory"):
        od.prepare_out_dir(tmp_path, True)
    a_file = tmp_path / "results.csv"
    a_file.write_text("x")
    with pytest.raises(FileExistsError, match="not a directory"):
        od.prepare_out_dir(a_file, True)
    data = tmp_path / "data"
    data.mkdir()
    (data / "thesis.tex").write_text("precious")
    with pytest.raises(
        FileExistsError, match=r"no diloco-gym report marker \(\.diloco-gym-report\)"
    ):
        od.prepare_out_dir(data, True)
    outlock.release_out_locks()
    assert (data / "thesis.tex").read_text() == "precious"


def test_prepare_accepts_a_new_or_empty_directory_and_needs_force_for_a_report(tmp_path):
    assert od.prepare_out_dir(tmp_path / "new", False) == tmp_path / "new"
    outlock.release_out_locks()
    (tmp_path / "empty").mkdir()
    od.prepare_out_dir(tmp_path / "empty", False)
    outlock.release_out_locks()
    od.write_output_dir(tmp_path / "r", False, _fill("one"))
    with pytest.raises(FileExistsError, match="pass --force"):
        od.prepare_out_dir(tmp_path / "r", False)
    outlock.release_out_locks()
    od.prepare_out_dir(tmp_path / "r", True)
    outlock.release_out_locks()


def test_is_report_dir(tmp_path):
    assert not od.is_report_dir(tmp_path / "missing")
    od.write_output_dir(tmp_path / "r", False, _fill("one"))
    assert od.is_report_dir(tmp_path / "r")
    (tmp_path / "r" / "sub").mkdir()
    assert not od.is_report_dir(tmp_path / "r")  # a report writes plain files only
    unmarked = tmp_path / "u"
    unmarked.mkdir()
    (unmarked / "notes.txt").write_text("x")
    assert not od.is_report_dir(unmarked)


def test_clean_leftovers_removes_only_dead_runs_marked_or_empty_siblings(tmp_path):
    out = tmp_path / "r"
    dead = _dead_pid()
    marked = tmp_path / f".r.partial-{dead}"
    marked.mkdir()
    (marked / od.MARKER).write_text("diloco-gym report directory")
    empty = tmp_path / f".r.old-{dead}"
    empty.mkdir()
    foreign = tmp_path / f".r.old-{dead + 1}"  # no marker, not empty: someone else's
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep")
    live = tmp_path / f".r.partial-{os.getppid()}"  # a running process is writing there
    live.mkdir()
    (live / od.MARKER).write_text("diloco-gym report directory")
    other = tmp_path / f".s.partial-{dead}"  # another output's leftover
    other.mkdir()
    removed = od.clean_leftovers(out)
    assert sorted(p.name for p in removed) == sorted([marked.name, empty.name])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [foreign.name, live.name, other.name]
    )


def test_owned_entries_refuses_someone_elses_directory(tmp_path) -> None:
    hint = "choose another --out"
    assert od.owned_entries(tmp_path / "new", "cells.jsonl", "a sweep's directory", hint) == []
    assert od.owned_entries(tmp_path, "cells.jsonl", "a sweep's directory", hint) == []
    (tmp_path / "b.txt").write_text("mine")
    (tmp_path / "a.csv").write_text("mine")
    with pytest.raises(FileExistsError) as exc:
        od.owned_entries(tmp_path, "cells.jsonl", "a sweep's directory", hint)
    msg = str(exc.value)
    assert f"{tmp_path} is not a sweep's directory: it holds 2 entries ('a.csv', 'b.txt')" in msg
    assert msg.endswith("but no cells.jsonl; choose another --out")
    for i in range(5):
        (tmp_path / f"x{i}").write_text("")
    with pytest.raises(FileExistsError, match=r"'b.txt', 'x0', 'x1', 'x2' and 2 more\)"):
        od.owned_entries(tmp_path, "cells.jsonl", "a sweep's directory", hint)
    (tmp_path / "cells.jsonl").mkdir()  # a directory of the marker's name is no marker
    with pytest.raises(FileExistsError, match="no cells.jsonl"):
        od.owned_entries(tmp_path, "cells.jsonl", "a sweep's directory", hint)
    (tmp_path / "cells.jsonl").rmdir()
    (tmp_path / "cells.jsonl").write_text("")
    assert od.owned_entries(tmp_path, "cells.jsonl", "x", hint)[0] == "a.csv"
    with pytest.raises(FileExistsError, match="a.csv exists and is not a directory; choose"):
        od.owned_entries(tmp_path / "a.csv", "cells.jsonl", "x", hint)
    assert sorted(p.name for p in tmp_path.iterdir())[:2] == ["a.csv", "b.txt"]  # untouched


def test_owned_entries_recognises_an_unmarked_directory_only_when_asked(tmp_path) -> None:
    (tmp_path / "report.md").write_text("old")
    (tmp_path / "results.csv").write_text("old")
    with pytest.raises(FileExistsError, match=r"but no diloco-gym report marker; pick"):
        od.owned_entries(
            tmp_path, od.MARKER, "a report", "pick", marker_label="diloco-gym report marker"
        )
    assert od.owned_entries(
        tmp_path, od.MARKER, "a report", "pick", recognise=lambda e: "report.md" in e
    ) == ["report.md", "results.csv"]


def test_an_unmarked_old_report_with_user_files_names_them(tmp_path, monkeypatch) -> None:
    """A report of a release before the marker is replaced by --force only when it holds
    nothing else; the refusal names the entries no report wrote."""
    monkeypatch.chdir(tmp_path)
    old = tmp_path / "old"
    old.mkdir()
    for name in ("report.md", "results.csv", "notes.txt"):
        (old / name).write_text("x")
    try:
        with pytest.raises(FileExistsError, match=r"besides a previous report .*'notes.txt'"):
            od.prepare_out_dir(old, True)
    finally:
        outlock.release_out_locks()
    assert (old / "notes.txt").read_text() == "x"


def test_force_never_deletes_the_files_of_an_unmarked_directory(tmp_path, monkeypatch) -> None:
    """A directory of a release before the marker whose files all look like a report's: a
    ``fig_*.png`` of the user's cannot be told from the report's figures, so ``--force``
    refuses (one line naming the directory and its files) and deletes nothing."""
    monkeypatch.chdir(tmp_path)
    old = tmp_path / "old"
    old.mkdir()
    for name in ("report.md", "results.csv", "fig_mine.png"):
        (old / name).write_text(f"the user's {name}")
    try:
        with pytest.raises(FileExistsError) as exc:
            od.write_output_dir(old, True, _fill("new"))
    finally:
        outlock.release_out_locks()
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith(f"refusing to replace {old}: it has no diloco-gym report marker")
    assert "'fig_mine.png'" in msg and "'report.md'" in msg and "'results.csv'" in msg
    for name in ("report.md", "results.csv", "fig_mine.png"):
        assert (old / name).read_text() == f"the user's {name}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]  # nothing written beside it
    # without --force the refusal is the same (no hint to pass --force)
    try:
        with pytest.raises(FileExistsError, match="no diloco-gym report marker"):
            od.prepare_out_dir(old, False)
    finally:
        outlock.release_out_locks()
