"""The report as one self-contained HTML page: the table and every plot embedded as base64 PNG."""
from __future__ import annotations

import base64
import html
from pathlib import Path

from fl.report.marks import footnotes, row_marks
from fl.report.tables import bold_cells, cell_mark, fmt_stat

# Sized for a laptop (1366 px): small type, long labels and headers wrap, and a table still wider than the
# window scrolls inside its own box rather than widening the page.
STYLE = """body{font-family:system-ui,sans-serif;margin:1em auto;padding:0 1em;max-width:1400px;font-size:14px}
.scroll{overflow-x:auto;max-width:100%}table{border-collapse:collapse;font-size:12px}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:right;white-space:nowrap}
th{background:#f3f3f3;white-space:normal;vertical-align:bottom;min-width:4.5em;max-width:9em}
td.l{text-align:left;white-space:normal;min-width:6em;max-width:18em;overflow-wrap:anywhere}
figure{display:inline-block;margin:6px;max-width:100%}figcaption{font-size:12px;color:#444}
img{max-width:min(640px,100%)}p.foot{font-size:12px;margin:4px 0}"""


def image_tag(path: Path, alt: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def breakable(text: str) -> str:
    """Escaped text that may wrap after / and _ (metric names have no spaces to wrap at)."""
    return html.escape(text).replace("/", "/<wbr>").replace("_", "_<wbr>")


def html_page(title: str, caption: str, rows: list[dict], cols: list[tuple], figures: list[tuple[str, Path]],
              notes: list[str]) -> str:
    head = ["setting", "method", "seeds", "headline (final)"] + [c[2] for c in cols]
    bold = bold_cells(rows, [(m, s) for m, s, _ in cols])
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
           f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1><p>{html.escape(caption)}</p>",
           "<div class='scroll'><table><tr>" + "".join(f"<th>{breakable(h)}</th>" for h in head) + "</tr>"]
    for i, r in enumerate(rows):
        mark = cell_mark(r)
        headline = fmt_stat(r["cells"][r["headline"]]["final"], r["headline"], mark=mark)
        cells = [(html.escape(r["setting"]), "l"), (html.escape(r["method"]), "l"),
                 (f"{len(r['seeds'])}{row_marks(r)}", ""), (breakable(f"{r['headline']}: {headline}"), "l")]
        for m, s, _ in cols:
            text = html.escape(fmt_stat(r["cells"][m][s], m)) if m in r["cells"] else "—"
            cells.append(((f"<b>{text}</b>" if (i, m, s) in bold else text) + (mark if text != "—" else ""), ""))
        out.append("<tr>" + "".join(f"<td class='{c}'>{t}</td>" for t, c in cells) + "</tr>")
    out.append("</table></div>")
    out += [f"<p class='foot'>{mark} {html.escape(text)}</p>" for mark, text in footnotes(rows)]
    if figures:
        out.append("<h2>Plots</h2>")
        out += [f"<figure>{image_tag(p, name)}<figcaption>{html.escape(name)}</figcaption></figure>"
                for name, p in figures]
    if notes:
        out.append("<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    out.append("</body></html>")
    return "\n".join(out)
