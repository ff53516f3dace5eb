"""The reproduction as Markdown (also what the command prints; it links no file) and as one self-contained HTML page
with fl.report's plots embedded."""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from fl.report.html import STYLE, image_tag
from fl.reproduce.claims import (
    BUDGET,
    CAUSE_WORDS,
    FAILS,
    HOLDS,
    METHOD,
    NOT_JUDGED,
    OVERLAP,
    PARTIAL,
    REGIME,
    UNRESOLVED,
    Check,
    ClaimResult,
)
from fl.reproduce.compare import ColumnView
from fl.reproduce.paper import Paper

STAT_WORDS = {"final": "its last evaluation", "last": "the mean over its last K evaluations",
              "best_val": "its round of best {select}"}
ORDER = [FAILS, UNRESOLVED, PARTIAL, NOT_JUDGED, HOLDS, None]  # the order claims are listed in


@dataclass
class Report:
    paper: Paper
    scale: str
    seeds: list[int]
    views: list[ColumnView]
    claims: list[ClaimResult]
    left: list[str]                        # what is not run at this scale, one line each
    notes: list[str] = field(default_factory=list)   # runs that failed, were skipped or unreadable
    setting: list[str] = field(default_factory=list)  # the Twin: line and a line per column (setting.py)
    figures: dict[str, list[tuple[str, Path]]] = field(default_factory=dict)   # table id -> fl.report's plots


def pair(mean: Optional[float], std: Optional[float], digits: int) -> str:
    if mean is None:
        return "—"
    return f"{mean:.{digits}f}" + ("" if std is None else f" ± {std:.{digits}f}")


def _ours(line, digits: int) -> str:
    if line.ours is None or not line.ours.n:
        return f"— ({line.why_not})" if line.why_not else "—"
    c = line.ours
    return f"{pair(c.mean, c.std, digits)}{c.mark} (n={c.n})"


def _how(view: ColumnView) -> str:
    t = view.table
    stat = STAT_WORDS[t.stat].format(select=t.select)
    variants = (f"; where a row has several variants, each seed takes the one with the best {t.select}"
                if t.select else "")
    return (f"Ours: `{t.metric}` of each run at {stat}{variants}; mean ± sample std over seeds. The paper's std: "
            f"{t.paper_std or 'as printed'}. Rank 1 = best ({'lower' if t.lower_is_better else 'higher'} is better).")


def _table_md(view: ColumnView) -> list[str]:
    d = view.digits
    lines = ["| method | paper | paper rank | ours | our rank |", "|---|---|---|---|---|"]
    for ln in view.lines:
        paper = pair(*ln.paper, d) if ln.paper else "—"
        lines.append(f"| {ln.method} | {paper} | {ln.paper_rank or '—'} | {_ours(ln, d)} | {ln.our_rank or '—'} |")
    notes = [f"- {n}" for n in view.notes]
    return lines + ["", view.rho_text] + ([""] + notes if notes else [])


def check_line(check: Check) -> str:
    """One check that ran, as the claim lists it: its verdict and numbers, and whether it is judged."""
    head = f"{check.label}: " if check.label else ""
    if check.cause == REGIME:
        return f"{head}NOT JUDGED (regime: {check.regime_why}); as read: {check.verdict}: {check.detail}"
    if check.cause == BUDGET:
        return f"{head}NOT JUDGED (budget: {check.doubled_detail}); as read: {check.verdict}: {check.detail}"
    twice = "; the same at twice the twin's budget" if check.budget == "stable" else ""
    return f"{head}{check.verdict}: {check.detail}{twice}"


def _claim_md(result: ClaimResult) -> list[str]:
    c = result.claim
    out = [f"- **{result.label}** `{c.id}`: {c.text} ({c.source})"]
    if result.cause:
        out.append(f"  - cause: {result.cause}: {CAUSE_WORDS[result.cause]}")
    out += [f"  - {check_line(ch)}" for ch in result.checks if ch.verdict]
    out += [f"  - {line}" for line in _skipped(result)]
    if result.note:
        out.append(f"  - {'twin note: ' if c.twin_note and result.note == c.twin_note else ''}"
                   f"{result.note}")
    return out


def _skipped(result: ClaimResult) -> list[str]:
    """The checks that did not run, none of them counted in n: those with cells at this scale that were not run
    (outside the twin's time budget), then those with no cell at this scale."""
    if not result.verdict:
        return []
    out = []
    for exists, words in ((True, "not run at this scale (outside the twin's time budget; --every-cell runs it)"),
                          (False, "paper scale only")):
        names = [ch.label or ch.detail for ch in result.checks if not ch.verdict and ch.counts == exists]
        out += [f"{words}: {', '.join(names)}"] if names else []
    return out


RULES_TEXT = ("UNRESOLVED: the seed spreads (mean ± std) overlap, or a cell has one seed. NOT JUDGED: the twin is "
              "outside the paper's regime there (its reference baselines far from the paper's), or the verdict changes "
              "at twice the twin's training budget. k of n: of the n checks (columns or rows) that ran and are judged, "
              "k hold (or fail). The rules are in fl/reproduce/claims.py.")


def markdown(report: Report) -> str:
    p = report.paper
    twin = report.scale == "twin"
    out = [f"# {p.title} ({p.id}): reproduction at --scale {report.scale}", "", *report.setting, "",
           f"Paper: {p.source}. Seeds: {', '.join(map(str, report.seeds))}. Runs: fl.sweep's, in the runs/ folder "
           f"the command writes beside reproduce.md (every run's values are in reproduce.json; fl.report's plots of "
           f"each table are embedded in reproduce.html). {RULES_TEXT}", "", *summary_lines(report), ""]
    for table in p.tables:
        views = [v for v in report.views if v.table is table]
        if not views:
            continue
        data = " (on the generated twins of its data)" if twin else ""
        out += [f"## {table.id}: {table.caption}{data}", "", f"{table.source}. {_how(views[0])}", ""]
        for view in views:
            label = view.column.label + ("" if view.column.paper_column == view.column.id
                                         else f" (compared with the paper's {view.column.paper_column})")
            out += [f"### {label}{', generated twin' if twin else ''}", "", *_table_md(view), ""]
    checked = [r for r in report.claims if r.verdict]
    unchecked = [r for r in report.claims if not r.verdict]
    out += ["## Claims", ""]
    for r in sorted(checked, key=lambda r: ORDER.index(r.verdict)):
        out += _claim_md(r)
    if unchecked:
        out += ["", "Not checked at this scale:", ""]
        out += [f"- `{r.claim.id}`: {r.claim.text} ({r.note})" for r in unchecked]
    if report.left:
        out += ["", f"## Left out at --scale {report.scale}", "", *[f"- {x}" for x in report.left]]
    if report.notes:
        out += ["", "## Notes", "", *[f"- {n}" for n in report.notes]]
    return "\n".join(out).rstrip() + "\n"


def summary_lines(report: Report) -> list[str]:
    """The verdicts counted, with their causes: what the command prints last and the output carries first."""
    def count(verdict, cause=None):
        return sum(r.verdict == verdict and (cause is None or r.cause == cause) for r in report.claims)
    return [f"{report.paper.id} at --scale {report.scale}: {count(HOLDS)} claims hold, {count(PARTIAL)} hold in part "
            f"(HOLDS in k of n), {count(FAILS, METHOD)} fail (cause: method), {count(UNRESOLVED, OVERLAP)} unresolved "
            f"(cause: overlap), {count(NOT_JUDGED, REGIME)} not judged (cause: regime), {count(NOT_JUDGED, BUDGET)} "
            f"not judged (cause: budget), {count(None)} not checked at this scale"]


# ---- HTML --------------------------------------------------------------------------------------------------
def _esc(text: str) -> str:
    return html.escape(text).replace("**", "")


def html_page(report: Report) -> str:
    p = report.paper
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{_esc(p.id)}: reproduction</title>",
           f"<style>{STYLE}\n.HOLDS{{color:#186a1e}}.FAILS{{color:#b00020}}.UNRESOLVED{{color:#8a6100}}"
           ".PARTIAL{{color:#4a6a1e}}.NOT_JUDGED{{color:#555}}</style>",
           f"</head><body><h1>{_esc(p.title)} ({_esc(p.id)}): reproduction at --scale {report.scale}</h1>",
           *[f"<p>{_esc(line.removeprefix('- '))}</p>" for line in report.setting],
           f"<p>Paper: {_esc(p.source)}. Seeds: {', '.join(map(str, report.seeds))}. {_esc(RULES_TEXT)}</p>",
           *[f"<p><b>{_esc(line)}</b></p>" for line in summary_lines(report)]]
    for table in p.tables:
        views = [v for v in report.views if v.table is table]
        if not views:
            continue
        out += [f"<h2>{_esc(table.id)}: {_esc(table.caption)}</h2>",
                f"<p>{_esc(table.source)}. {_esc(_how(views[0]).replace('`', ''))}</p>"]
        for view in views:
            d = view.digits
            out.append(f"<h3>{_esc(view.column.label)}</h3><div class='scroll'><table><tr><th>method</th>"
                       "<th>paper</th><th>paper rank</th><th>ours</th><th>our rank</th></tr>")
            for ln in view.lines:
                cells = [ln.method, pair(*ln.paper, d) if ln.paper else "—", str(ln.paper_rank or "—"),
                         _ours(ln, d), str(ln.our_rank or "—")]
                out.append("<tr>" + "".join(f"<td class='{'l' if i in (0, 3) else ''}'>{_esc(c)}</td>"
                                            for i, c in enumerate(cells)) + "</tr>")
            out.append("</table></div>")
            out.append(f"<p class='foot'>{_esc(view.rho_text)}</p>" + "".join(f"<p class='foot'>{_esc(n)}</p>"
                                                                   for n in view.notes))
        figures = report.figures.get(table.id, [])
        out += [f"<figure>{image_tag(path, name)}<figcaption>{_esc(name)}</figcaption></figure>"
                for name, path in figures]
    out.append("<h2>Claims</h2><ul>")
    for r in sorted(report.claims, key=lambda r: ORDER.index(r.verdict)):
        checks = f"<li>cause: {_esc(r.cause)}: {_esc(CAUSE_WORDS[r.cause])}</li>" if r.cause else ""
        checks += "".join(f"<li>{_esc(check_line(ch))}</li>" for ch in r.checks if ch.verdict)
        checks += "".join(f"<li>{_esc(line)}</li>" for line in _skipped(r))
        note = f"<li>{_esc(r.note)}</li>" if r.note else ""
        style = (r.verdict or "").replace(" ", "_")
        out.append(f"<li><b class='{style}'>{_esc(r.label)}</b> <code>{_esc(r.claim.id)}</code>: "
                   f"{_esc(r.claim.text)} ({_esc(r.claim.source)})<ul>{checks}{note}</ul></li>")
    out.append("</ul>")
    for title, items in ((f"Left out at --scale {report.scale}", report.left), ("Notes", report.notes)):
        if items:
            out.append(f"<h2>{_esc(title)}</h2><ul>" + "".join(f"<li>{_esc(x)}</li>" for x in items) + "</ul>")
    out.append("</body></html>")
    return "\n".join(out)
