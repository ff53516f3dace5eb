"""The report as one self-contained HTML page: the table and every plot embedded as base64 PNG."""
from __future__ import annotations

import base64
import html
from pathlib import Path

from fl.report.tables import fmt_stat

STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}
th{background:#f3f3f3}td.l{text-align:left}figure{display:inline-block;margin:8px}
figcaption{font-size:12px;color:#444}img{max-width:640px}"""


def image_tag(path: Path, alt: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def html_page(title: str, caption: str, rows: list[dict], cols: list[tuple], figures: list[tuple[str, Path]],
              notes: list[str]) -> str:
    head = ["setting", "method", "seeds", "headline (final)"] + [c[2] for c in cols]
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
           f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1><p>{html.escape(caption)}</p>",
           "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    for r in rows:
        cells = [(r["setting"], "l"), (r["method"], "l"), (str(len(r["seeds"])), ""),
                 (f"{r['headline']}: {fmt_stat(r['cells'][r['headline']]['final'])}", "l")]
        cells += [(fmt_stat(r["cells"][m][s]) if m in r["cells"] else "—", "") for m, s, _ in cols]
        out.append("<tr>" + "".join(f"<td class='{c}'>{html.escape(t)}</td>" for t, c in cells) + "</tr>")
    out.append("</table>")
    if figures:
        out.append("<h2>Plots</h2>")
        out += [f"<figure>{image_tag(p, name)}<figcaption>{html.escape(name)}</figcaption></figure>"
                for name, p in figures]
    if notes:
        out.append("<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    out.append("</body></html>")
    return "\n".join(out)
