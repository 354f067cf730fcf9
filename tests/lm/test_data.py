"""The byte-level corpus (``diloco_gym/lm/data.py``): the split by file name, the cap per
split, the digest, the learners' shards and the errors, on small directories of files."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from diloco_gym.lm.data import Corpus, load_corpus, stdlib_dir


def _heldout(name: str, fraction: float) -> bool:
    return hashlib.sha256(name.encode()).digest()[0] < round(256 * fraction)


def _names(fraction: float) -> tuple[list[str], list[str]]:
    """Two file names of each split at ``fraction``."""
    names = [f"m{i}.py" for i in range(200)]
    held = [n for n in names if _heldout(n, fraction)][:2]
    train = [n for n in names if not _heldout(n, fraction)][:2]
    return train, held


def _write(tmp_path, names: list[str]) -> None:
    for n in names:
        (tmp_path / n).write_bytes(f"# {n}\n".encode() * 10)


def test_files_split_by_name_in_name_order(tmp_path):
    train, held = _names(0.5)
    _write(tmp_path, train + held)
    (tmp_path / "notes.txt").write_text("not python")
    c = load_corpus(tmp_path, heldout_fraction=0.5)
    assert (c.train_files, c.heldout_files) == (2, 2)
    want_train = b"\n".join((tmp_path / n).read_bytes() for n in sorted(train))
    want_held = b"\n".join((tmp_path / n).read_bytes() for n in sorted(held))
    assert c.train.tobytes() == want_train and c.heldout.tobytes() == want_held
    assert c.train.dtype == np.uint8
    assert c.digest == hashlib.sha256(want_train + b"\xff" + want_held).hexdigest()
    assert load_corpus(tmp_path, heldout_fraction=0.5).digest == c.digest  # repeatable


def test_max_bytes_caps_each_split(tmp_path):
    train, held = _names(0.5)
    _write(tmp_path, train + held)
    size = len((tmp_path / train[0]).read_bytes())
    c = load_corpus(tmp_path, heldout_fraction=0.5, max_bytes=size + 5)
    # the first file whole, five bytes of the second, joined by a newline
    assert len(c.train) == size + 5 + 1 and c.train_files == 2
    assert len(c.heldout) == size + 5 + 1
    c = load_corpus(tmp_path, heldout_fraction=0.5, max_bytes=size)
    assert c.train_files == 1 and len(c.train) == size  # the second file is skipped


def test_errors_name_the_fraction_and_the_directory(tmp_path):
    with pytest.raises(ValueError, match="heldout_fraction must be in"):
        load_corpus(tmp_path, heldout_fraction=0.0)
    with pytest.raises(ValueError, match="heldout_fraction must be in"):
        load_corpus(tmp_path, heldout_fraction=1.0)
    with pytest.raises(ValueError, match=f"{tmp_path}: no \\*.py files for the train split"):
        load_corpus(tmp_path)
    train, held = _names(0.5)
    _write(tmp_path, train)
    with pytest.raises(ValueError, match="for the heldout split"):
        load_corpus(tmp_path, heldout_fraction=0.5)


def test_shards_are_contiguous_disjoint_and_equally_long():
    data = np.arange(23, dtype=np.uint8)
    c = Corpus(data, data[:3], 1, 1, "x")
    shards = c.shards(4)
    assert [len(s) for s in shards] == [5, 5, 5, 5]
    assert np.array_equal(np.concatenate(shards), data[:20])
    assert np.array_equal(c.shards(1)[0], data)
    with pytest.raises(ValueError, match="number of shards must be >= 1, got 0"):
        c.shards(0)


def test_the_default_directory_is_the_standard_library():
    assert (stdlib_dir() / "os.py").is_file()
    c = load_corpus(max_bytes=20_000)
    assert c.train_files >= 1 and c.heldout_files >= 1
    assert len(c.train) <= 20_000 + c.train_files and len(c.heldout) <= 20_000 + c.heldout_files
