"""Are the twins in their papers' regime? Each seed paper's reference baselines (the `baselines:` rows of its tables in
fl/reproduce/papers: FedAvg and Local where a table has them, else the paper's own baseline) run on the twin and set
beside the paper's values; a cell is in the regime by fl/reproduce/regime.py's rule (within 10 accuracy points of the
paper's value; a raw quantity such as a KL within a factor 2 of it).
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
from fl.reproduce.regime import REGIME_POINTS, REGIME_RATIO, outside  # noqa: E402
from fl.reproduce.spec import available_papers, load_paper  # noqa: E402

REGIME = {True: "yes", False: "NO"}


def calibration_rows(paper_id: str, record: dict) -> list[dict]:
    """One row per baseline cell of a reproduce.json: the paper's value, the twin's, the gap and whether in regime."""
    paper = load_paper(paper_id)
    rows = []
    for cell in record["cells"]:
        table = paper.table(cell["table"])
        theirs = paper_mean(table, cell["column"], cell["row"])
        if theirs is None or not cell["n"]:
            continue
        rows.append({"paper": paper_id, "table": cell["table"], "column": cell["column"], "row": cell["row"],
                     "paper_value": theirs, "twin": cell["mean"], "std": cell["std"], "n": cell["n"],
                     "seeds": cell["seeds"], "gap": cell["mean"] - theirs,
                     "in_regime": not outside(table, theirs, cell["mean"])})
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
    inside = sum(r["in_regime"] for r in rows)
    print(f"\n{inside} of {len(rows)} reference-baseline cells in the paper's regime (an accuracy within "
          f"{REGIME_POINTS:g} points of the paper's, a raw quantity within a factor {REGIME_RATIO:g})")
    (ROOT / args.out / "calibration.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
