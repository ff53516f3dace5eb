"""Are the twins in their papers' regime? Each seed paper's reference baselines (the `baselines:` rows of its tables in
fl/reproduce/papers: FedAvg and Local where a table has them, else the paper's own baseline) run on the twin and set
beside the paper's values; a cell is in the regime when the twin's mean is within 10 accuracy points of the paper's.
The knob the twins are calibrated with is the generated data's pixel noise (data.embedded.noise), set with a
one-line note in each twin config; the figures are in bench/README.md ("Twin calibration").

    python bench/calibrate_twins.py [PAPER ...] [--seeds N] [--out DIR] [--parallel P]

Runs `python -m fl.reproduce PAPER --baselines` for each paper (default: all five), then reads its reproduce.json.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fl.reproduce.claim_cells import paper_mean  # noqa: E402
from fl.reproduce.setting import REGIME_POINTS  # noqa: E402
from fl.reproduce.spec import available_papers, load_paper  # noqa: E402

REGIME = {True: "yes", False: "NO", None: "not an accuracy"}


def calibration_rows(paper_id: str, record: dict) -> list[dict]:
    """One row per baseline cell of a reproduce.json: the paper's value, the twin's, the gap and whether in regime."""
    paper = load_paper(paper_id)
    rows = []
    for cell in record["cells"]:
        table = paper.table(cell["table"])
        theirs = paper_mean(table, cell["column"], cell["row"])
        if theirs is None or not cell["n"]:
            continue
        gap = cell["mean"] - theirs
        accuracy = table.unit in ("percent", "fraction")  # a raw quantity (a KL, adaptability) is shown, not judged
        points = abs(gap) * 100.0 / table.factor  # the table's units to accuracy points
        rows.append({"paper": paper_id, "table": cell["table"], "column": cell["column"], "row": cell["row"],
                     "paper_value": theirs, "twin": cell["mean"], "std": cell["std"], "n": cell["n"],
                     "seeds": cell["seeds"], "gap": gap, "in_regime": points <= REGIME_POINTS if accuracy else None})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("papers", nargs="*", help=f"default: {' '.join(available_papers())}")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--out", default="outputs/calibrate_twins", help="fl.reproduce's --out")
    p.add_argument("--parallel", type=int, default=2)
    args = p.parse_args()
    papers = args.papers or available_papers()
    rows = []
    for paper in papers:
        cmd = [sys.executable, "-m", "fl.reproduce", paper, "--baselines", "--seeds", str(args.seeds),
               "--out", args.out, "--parallel", str(args.parallel)]
        print("$", " ".join(cmd[1:]), flush=True)
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout[-2000:] + done.stderr[-2000:], file=sys.stderr)
            return done.returncode
        rows += calibration_rows(paper, json.loads((ROOT / args.out / paper / "twin" / "reproduce.json").read_text()))
    print(f"\n| paper | table | column | baseline | paper | twin (seeds {args.seeds}) | gap | in regime |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        spread = f" ± {r['std']:.1f}" if r["std"] is not None else ""
        print(f"| {r['paper']} | {r['table']} | {r['column']} | {r['row']} | {r['paper_value']:.2f} | "
              f"{r['twin']:.2f}{spread} | {r['gap']:+.2f} | {REGIME[r['in_regime']]} |")
    judged = [r for r in rows if r["in_regime"] is not None]
    inside = sum(r["in_regime"] for r in judged)
    print(f"\n{inside} of {len(judged)} reference-baseline accuracy cells within {REGIME_POINTS:g} points of the paper "
          f"({len(rows) - len(judged)} cells of other quantities shown, not judged)")
    (ROOT / args.out / "calibration.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
