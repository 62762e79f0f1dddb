"""README's two Quickstart commands, read from README.md: the main experiment and the tests.

`.ci/run` runs the test command through this module (`python -m tests.readme_commands
test`), so CI runs exactly the command a reader copies; tests/test_readme.py checks the
block's shape.
"""

from __future__ import annotations

import pathlib
import re
import sys

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"^## Quickstart\n\n```bash\n(.*?)^```", re.S | re.M)


def quickstart(readme: pathlib.Path = README) -> dict[str, str]:
    """{'experiment': ..., 'test': ...}: the Quickstart block's two lines, in that order."""
    match = _BLOCK.search(readme.read_text())
    if match is None:
        raise ValueError(f"{readme}: no '## Quickstart' section opening with a bash block")
    lines = [line for line in match.group(1).splitlines() if line.strip()]
    if len(lines) != 2:
        raise ValueError(f"{readme}: the Quickstart block has {len(lines)} commands, not 2")
    return dict(zip(("experiment", "test"), lines, strict=True))


if __name__ == "__main__":
    print(quickstart()[sys.argv[1]])
