"""How messages name the entry points: as the user started this process. Run as a console script
(`craftax-train`, `craftax-label`, ...), a hint names the console scripts; run as `python
train.py`, it names the scripts. Both forms take the same arguments."""

from __future__ import annotations

import os
import sys


def command(script: str) -> str:
    """`python label.py`, or `craftax-label` when this process is one of the console scripts."""
    if os.path.basename(sys.argv[0] or "").startswith("craftax-"):
        return "craftax-" + script.removesuffix(".py")
    return f"python {script}"
