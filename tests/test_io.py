"""The leaf diloco_gym.io: atomic writes, JSON of numpy values, a free loopback port, the
rule for writing into a directory."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import numpy as np
import pytest

from diloco_gym import io


def test_save_atomic_leaves_the_old_file_when_the_writer_dies(tmp_path: Path) -> None:
    path = tmp_path / "model.zip"
    path.write_bytes(b"old")

    def dies(tmp: str) -> None:
        assert Path(tmp).parent == tmp_path and Path(tmp).name.startswith(".model.partial-")
        assert tmp.endswith(".zip")  # the suffix is kept (writers that add their own)
        Path(tmp).write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        io.save_atomic(dies, path)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.zip"]  # no temporary left


def test_write_text_atomic_replaces_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "out.csv"
    io.write_text_atomic(path, "a,b\n1,2\n")
    io.write_text_atomic(str(path), "é\n")
    assert path.read_bytes() == "é\n".encode()
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]


def test_json_helpers_convert_numpy_values_and_differ_on_the_rest() -> None:
    doc = {"b": np.True_, "i": np.int64(3), "f": np.float32(0.5), "a": np.arange(2)}
    want = '{"b": true, "i": 3, "f": 0.5, "a": [0, 1]}'
    assert json.dumps(doc, default=io.json_strict) == want
    assert json.dumps(doc, default=io.json_default) == want
    assert json.dumps({"p": Path("x")}, default=io.json_default) == '{"p": "x"}'
    with pytest.raises(TypeError, match="cannot store PosixPath|cannot store WindowsPath"):
        json.dumps({"p": Path("x")}, default=io.json_strict)


def test_free_port_can_be_bound() -> None:
    port = io.free_port()
    assert 0 < port < 65536
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))


def test_owned_entries_refuses_someone_elses_directory(tmp_path: Path) -> None:
    hint = "choose another --out"
    assert io.owned_entries(tmp_path / "new", "cells.jsonl", "a sweep's directory", hint) == []
    assert io.owned_entries(tmp_path, "cells.jsonl", "a sweep's directory", hint) == []
    (tmp_path / "b.txt").write_text("mine")
    (tmp_path / "a.csv").write_text("mine")
    with pytest.raises(FileExistsError) as exc:
        io.owned_entries(tmp_path, "cells.jsonl", "a sweep's directory", hint)
    msg = str(exc.value)
    assert f"{tmp_path} is not a sweep's directory: it holds 2 entries ('a.csv', 'b.txt')" in msg
    assert msg.endswith("but no cells.jsonl; choose another --out")
    for i in range(5):
        (tmp_path / f"x{i}").write_text("")
    with pytest.raises(FileExistsError, match=r"'b.txt', 'x0', 'x1', 'x2' and 2 more\)"):
        io.owned_entries(tmp_path, "cells.jsonl", "a sweep's directory", hint)
    (tmp_path / "cells.jsonl").mkdir()  # a directory of the marker's name is no marker
    with pytest.raises(FileExistsError, match="no cells.jsonl"):
        io.owned_entries(tmp_path, "cells.jsonl", "a sweep's directory", hint)
    (tmp_path / "cells.jsonl").rmdir()
    (tmp_path / "cells.jsonl").write_text("")
    assert io.owned_entries(tmp_path, "cells.jsonl", "x", hint)[0] == "a.csv"
    with pytest.raises(FileExistsError, match="a.csv exists and is not a directory; choose"):
        io.owned_entries(tmp_path / "a.csv", "cells.jsonl", "x", hint)
    assert sorted(p.name for p in tmp_path.iterdir())[:2] == ["a.csv", "b.txt"]  # untouched
