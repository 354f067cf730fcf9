"""diloco_gym/scale/cells.py: the old name of :mod:`diloco_gym.eval.cells` re-exports every
public name of it (the same objects) for one release. The cells' behaviour:
tests/eval/test_cells.py."""

from __future__ import annotations

from diloco_gym.eval import cells
from diloco_gym.scale import cells as old


def test_every_public_name_is_the_same_object():
    assert cells.__all__ == [
        "ReportCell",
        "run_report_cell",
        "run_report_cells",
        "cell_config",
        "regime_plan",
        "UNIT_BATCH",
    ]
    for name in cells.__all__:
        assert getattr(old, name) is getattr(cells, name), name


def test_a_cell_built_from_the_old_name_is_the_new_class():
    from diloco_gym.eval.report import ReportConfig

    assert isinstance(old.ReportCell(ReportConfig(), "bursty", 0), cells.ReportCell)
