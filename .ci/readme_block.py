"""Print one code block of README.md for .ci/run, so that CI runs the README's own lines.

    python3 .ci/readme_block.py install-run   # the block after <!-- quickstart: install-run -->
    python3 .ci/readme_block.py test          # the block after <!-- quickstart: test -->
    python3 .ci/readme_block.py python        # the first ```python block (the env snippet)

Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def block(name: str, text: str) -> str:
    """The code of the README block ``name`` (see the module docstring)."""
    if name == "python":
        m = re.search(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    else:
        pattern = rf"<!-- quickstart: {re.escape(name)} -->\s*```bash\n(.*?)^```"
        m = re.search(pattern, text, flags=re.S | re.M)
    if m is None:
        raise SystemExit(f".ci/readme_block.py: README.md has no {name!r} block")
    return m.group(1).strip()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: readme_block.py install-run|test|python")
    print(block(sys.argv[1], README.read_text(encoding="utf-8")))
