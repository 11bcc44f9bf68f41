"""What every page of ``exporter report`` shares: the frame (Content-Security-Policy, styles,
the error counter a browser test reads), tables, and prose from the console's lines.

No external resource: the page's Content-Security-Policy forbids any, so a page that would
need the network shows that as a violation in the browser test rather than silently.
"""

from __future__ import annotations

import json
import re
from html import escape

CSP = ("default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
       "img-src data:")


def prose(text: str) -> str:
    """Escaped text in which `this` (the console's way of naming a command) becomes code:
    the page shows no literal backticks."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(str(text)))


def table(headers: list[str], rows: list[list], cls: str = "", raw: bool = False) -> str:
    """Rows of cells, escaped (``raw``: cells are HTML already)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    cell = (lambda c: str(c)) if raw else (lambda c: escape(str(c)))
    body = "".join("<tr>" + "".join(f"<td>{cell(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def share_bar(value: float, largest: float, text: str) -> str:
    """A table cell's figure with a bar behind it, its length the value's share of
    ``largest`` (the column reads at a glance, as a profiler's table does)."""
    width = 0.0 if largest <= 0 else max(0.0, min(100.0, 100 * value / largest))
    return (f'<div class="share"><div class="fill" style="width:{width:.1f}%"></div>'
            f"<span>{escape(text)}</span></div>")


def ms(value: float) -> str:
    """0.000123 -> '0.000123 ms'; 27.98 -> '27.98 ms': four significant digits."""
    return f"{value:.4g} ms"


def program_blocks(programs: list, block) -> str:
    """``block(manifest)`` for each (label, manifest) of an artifact's programs: one
    unlabelled program as it is, a generating artifact's (prefill, decode, encode) each
    under its name."""
    if len(programs) == 1 and programs[0][0] is None:
        return block(programs[0][1])
    return "".join(f'<h3 class="program">{escape(label)}</h3>{block(manifest)}'
                   for label, manifest in programs)


def render_page(title: str, body: str, data: dict, script: str = "") -> str:
    raw = json.dumps(data, sort_keys=True).replace("<", "\\u003c")
    return _PAGE.format(title=escape(title), csp=CSP, css=CSS, body=body, data=raw,
                        script=script + _RENDERED)


CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#212529}
h1{font-size:22px;margin:0 0 4px}h2{border-bottom:1px solid #dee2e6;padding-bottom:4px}
section{margin:28px 0}table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #dee2e6;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f1f3f5}code{background:#f1f3f5;padding:0 3px}.hint{color:#868e96}
.chip{color:#fff;border-radius:4px;padding:2px 8px;margin-right:6px}
.ok{color:#2f9e44;font-weight:600}.warn{color:#e8590c;font-weight:600}
#ops td:first-child{border-left-width:6px}svg{display:block;margin:8px 0;overflow:visible}
.share{position:relative;min-width:150px}.share span{position:relative}
.share .fill{position:absolute;left:0;top:0;bottom:0;background:#d0ebff}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.best{background:#d3f9d8;font-weight:600}.side{display:flex;gap:24px;flex-wrap:wrap}
.graph td{font:12px/1.3 ui-monospace,monospace;word-break:break-all}.graph .w{color:#868e96}
.compare .best{display:block}.worst{color:#c92a2a;font-weight:600}
"""

# The last script sets data-rendered, so a test (or a person) can tell a page that ran
# from one that broke.
_RENDERED = "\ndocument.documentElement.dataset.rendered = 'yes';\n"

# Errors and CSP violations are counted on <html data-errors>.
_PAGE = """<!DOCTYPE html>
<html lang="en" data-errors="0"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<title>{title}</title><style>{css}</style>
<script>
(function () {{
  function count(message) {{
    const html = document.documentElement;
    html.dataset.errors = String(Number(html.dataset.errors) + 1);
    html.dataset.lastError = message;
  }}
  window.addEventListener('error', (e) => count(String(e.message)));
  document.addEventListener('securitypolicyviolation', (e) => count('CSP: ' + e.blockedURI));
}})();
</script></head>
<body>
{body}
<script id="report-data" type="application/json">{data}</script>
<script>{script}</script>
</body></html>
"""
