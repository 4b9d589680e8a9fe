"""Print the settings reference (Markdown tables) from the settings' own metadata.

``python -m scripts.settings_reference --write docs/settings.md`` replaces the block between the
``settings-reference`` markers, so the docs cannot drift from ``include/settings/``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from include.settings.params import settings_reference as reference

START, END = "<!-- settings-reference:start -->", "<!-- settings-reference:end -->"


def main() -> int:
    """Print the reference, or write it into a file between the markers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="file whose marked block to replace")
    args = parser.parse_args()
    text = reference()
    if not args.write:
        sys.stdout.write(text)
        return 0
    doc = args.write.read_text()
    block = f"{START}\n{text}{END}"
    new, n = re.subn(re.escape(START) + r".*?" + re.escape(END), lambda _: block, doc,
                     flags=re.S)
    if n != 1:
        print(f"{args.write}: markers not found", file=sys.stderr)
        return 1
    args.write.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
