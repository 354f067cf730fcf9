"""The leaf diloco_gym.io: atomic writes, JSON of numpy values, a free loopback port."""

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
