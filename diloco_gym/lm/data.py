"""The training text: the Python standard library's source files, at the byte level.

Why this corpus: it exists on every machine that runs the project (no download, no
vocabulary: a token is one byte, 256 symbols) and it is real text with long-range structure
(indentation, identifiers, docstrings), so a small model's loss keeps falling over the
runs' budget. It is under the PSF licence and is read, never copied into the repository.

The files are the ``*.py`` files directly in the standard library directory
(``sysconfig.get_paths()["stdlib"]``), in sorted name order. A file belongs to the
held-out split when the first byte of the SHA-256 of its name is below
``round(256 * heldout_fraction)``; the split depends on the file name only, so it is the
same on every machine. The standard library differs between Python versions, so a
calibration records the Python version and the SHA-256 of both splits
(:attr:`Corpus.digest`).
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Corpus", "load_corpus", "stdlib_dir"]


def stdlib_dir() -> Path:
    """The standard library directory of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


@dataclass(frozen=True)
class Corpus:
    """Byte arrays of the training and held-out splits (``uint8``)."""

    train: np.ndarray
    heldout: np.ndarray
    train_files: int
    heldout_files: int
    digest: str  # sha256 of (train bytes, 0xFF separator, held-out bytes), hex

    def shards(self, k: int) -> list[np.ndarray]:
        """``k`` contiguous, disjoint, equally long pieces of the training bytes."""
        if k < 1:
            raise ValueError(f"number of shards must be >= 1, got {k}")
        n = len(self.train) // k
        return [self.train[i * n : (i + 1) * n] for i in range(k)]


def load_corpus(
    directory: str | Path | None = None,
    *,
    heldout_fraction: float = 0.1,
    max_bytes: int = 8_000_000,
) -> Corpus:
    """Read the ``*.py`` files of ``directory`` (default: the standard library).

    ``max_bytes`` caps each split (files are taken in name order until the cap). Raises
    ``ValueError`` naming the directory when either split is empty.
    """
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction!r}")
    root = Path(directory) if directory is not None else stdlib_dir()
    files = sorted(root.glob("*.py"))
    cut = round(256 * heldout_fraction)
    parts: dict[str, list[bytes]] = {"train": [], "heldout": []}
    sizes = {"train": 0, "heldout": 0}
    for f in files:
        split = "heldout" if hashlib.sha256(f.name.encode()).digest()[0] < cut else "train"
        if sizes[split] >= max_bytes:
            continue
        data = f.read_bytes()[: max_bytes - sizes[split]]
        parts[split].append(data)
        sizes[split] += len(data)
    for split, chunks in parts.items():
        if not chunks:
            raise ValueError(f"{root}: no *.py files for the {split} split of the corpus")
    train = b"\n".join(parts["train"])
    heldout = b"\n".join(parts["heldout"])
    digest = hashlib.sha256(train + b"\xff" + heldout).hexdigest()
    return Corpus(
        np.frombuffer(train, dtype=np.uint8).copy(),
        np.frombuffer(heldout, dtype=np.uint8).copy(),
        len(parts["train"]),
        len(parts["heldout"]),
        digest,
    )
