"""Print the settings reference (Markdown tables) from the settings' own metadata.

``python -m scripts.settings_reference --write README.md`` replaces the block between the
``settings-reference`` markers, so the docs cannot drift from ``include/settings.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

from include.settings import GpuHostSettings, RunSettings, SourceSettings

START, END = "<!-- settings-reference:start -->", "<!-- settings-reference:end -->"
_SHOWN_AS = {"sources": "the bundled samples", "output_uri": "`var/runs` (local)"}


def _default(f: dataclasses.Field, value: Any) -> str:
    return _SHOWN_AS.get(f.name) or f"`{json.dumps(value)}`"


def _row(f: dataclasses.Field, value: Any) -> str:
    meta = f.metadata
    choices = f" One of {', '.join(f'`{c}`' for c in meta['choices'])}." if meta["choices"] \
        else ""
    return f"| `{f.name}` | {_default(f, value)} | {meta['description']}{choices} |"


def _nested(cls: type) -> list[str]:
    out = ["| key | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(cls):
        value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        out.append(_row(f, value))
    return out


def reference() -> str:
    """Return the Markdown settings reference."""
    defaults = RunSettings.from_mapping({}).to_dict()
    lines: list[str] = []
    section = None
    for f in dataclasses.fields(RunSettings):
        if f.metadata["section"] != section:
            section = f.metadata["section"]
            lines += ["", f"**{section}**", "", "| setting | default | meaning |", "|---|---|---|"]
        lines.append(_row(f, defaults[f.name]))
    lines += ["", "**Keys of a `sources` entry**", "", *_nested(SourceSettings)]
    lines += ["", "**Keys of a `gpu_hosts` entry**", "", *_nested(GpuHostSettings)]
    return "\n".join(lines).strip() + "\n"


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
