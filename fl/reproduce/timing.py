"""What a run is projected to take, for --dry-run: at twin scale the per-run wall time measured for its sweep point
(fl/reproduce/twin_seconds.json, written by bench/reproduce_budget.py, with the load it was measured under); at paper
scale bench/paper_scale.py's projection for its config on this project's 2-core CPU (the table in bench/README.md,
"Paper-scale rehearsal"), or why it has none."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

from fl.reproduce.paper import ROOT

TWIN_SECONDS = Path(__file__).resolve().parent / "twin_seconds.json"
BENCH_README = ROOT / "bench" / "README.md"
UNITS = {"s": 1, "min": 60, "h": 3600, "d": 86400}
DURATION = re.compile(r"(>\s*)?([\d.]+)\s*(s|min|h|d)\b")


def twin_seconds() -> tuple[dict[str, float], str]:
    """Measured seconds per run (key: <run folder>/<point id>) and how they were measured (one line)."""
    if not TWIN_SECONDS.is_file():
        return {}, "no per-run times measured (bench/reproduce_budget.py writes them)"
    doc = json.loads(TWIN_SECONDS.read_text())
    return dict(doc.get("seconds", {})), str(doc.get("measured", ""))


def parse_duration(text: str) -> tuple[Optional[float], bool]:
    """Seconds of "23 min" / "3.8 h" / "> 3.1 d", and whether it is a lower bound (">")."""
    m = DURATION.search(text)
    if not m:
        return None, False
    return float(m.group(2)) * UNITS[m.group(3)], bool(m.group(1))


def paper_scale() -> dict[str, tuple[Optional[float], str]]:
    """conf -> (projected seconds of the full run, what the rehearsal says), from bench/README.md's table of
    bench/paper_scale.py; a config it could not run has None and the reason."""
    if not BENCH_README.is_file():
        return {}
    rows, inside = {}, False
    for line in BENCH_README.read_text().splitlines():
        if line.startswith("## "):
            inside = line.startswith("## Paper-scale rehearsal")
        if not inside or not line.startswith("| ") or line.startswith(("| config", "|---")):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) < 10 or " " in cells[0]:  # the APFL-with-evaluators row and variants are not a config's own
            continue
        seconds, lower = parse_duration(cells[3])
        status = cells[-1].replace("**", "")
        text = (f"{'at least ' if lower else ''}{cells[3].lstrip('> ')} on the 2-core CPU" if seconds else status)
        rows.setdefault(cells[0], (seconds, text + ("" if status == "ok" or not seconds else f"; {status}")))
    return rows


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 72 * 3600 else f"{seconds / 86400:.1f} d"
