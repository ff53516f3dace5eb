"""The marks a table puts beside its numbers, and the footnotes that explain them: † a row of runs that diverged
(summary.json's "diverged"), ‡ a seed that was run more than once and is counted once (its newest run)."""
from __future__ import annotations

from datetime import datetime, timezone

from fl.report.runs import Run

DIVERGED = "†"
REPEATED = "‡"
TEX_MARKS = {DIVERGED: "\\dagger", REPEATED: "\\ddagger"}


def _when(t) -> str:
    return "time unknown" if t is None else datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def repeat_facts(runs: list[Run]) -> list[dict]:
    """For each seed of `runs` that stands for older identical runs: the seed, the run kept and the runs left out."""
    return [{"seed": r.seed, "kept": r.name, "finished": _when(r.finished), "from": r.finished_from,
             "dropped": [(o.name, _when(o.finished) + (f", diverged at round {o.diverged.get('round', '?')}"
                                                       if o.diverged else "")) for o in r.replaces]}
            for r in runs if r.replaces]


def diverged_facts(runs: list[Run]) -> list[dict]:
    """For each run of `runs` that diverged: its name and summary.json's {round, client, method, reason}."""
    return [{"run": r.name, **r.diverged} for r in runs if r.diverged]


def row_marks(row: dict) -> str:
    """The marks of a row's seed count."""
    return (DIVERGED if row.get("diverged") else "") + (REPEATED if row.get("repeats") else "")


def _diverged_text(facts: list[dict]) -> str:
    return "; ".join(f"{d['run']} at round {d.get('round', '?')} (client {d.get('client', '?')}, "
                     f"{d.get('method', '?')}: {d.get('reason', '?')})" for d in facts)


def footnotes(rows: list[dict], selection: bool = False) -> list[tuple[str, str]]:
    """(mark, text) for the marks `rows` carry. `selection`: rows of the model-selection table, where diverged runs
    are left out of the candidates rather than shown in a row of their own."""
    notes = []
    diverged = [(r, d) for r in rows for d in r.get("diverged", [])]
    if diverged:
        runs = "; ".join(f"{r['setting']} / {r['method']}: {_diverged_text([d])}" for r, d in diverged)
        notes.append((DIVERGED, (f"runs that diverged are not candidates: {runs}." if selection else
                                 f"diverged (summary.json's 'diverged'): {runs}. A diverged row holds these runs' "
                                 "values up to where they stopped, is not averaged with the healthy seeds of its "
                                 "method and is not ranked.")))
    repeats = [(r, f) for r in rows for f in r.get("repeats", [])]
    if repeats:
        how = {f["from"] for _, f in repeats if f["from"]}
        text = "; ".join(
            f"{r['setting']} / {r['method']} seed {f['seed']}: kept {f['kept']} (finished {f['finished']}), left out "
            + ", ".join(f"{name} ({when})" for name, when in f["dropped"]) for r, f in repeats)
        notes.append((REPEATED, f"a seed run more than once (the same setting, method variant and seed) counts once, "
                                f"by its newest run ({' or '.join(sorted(how)) or 'finish time unknown'}): {text}."))
    return notes
