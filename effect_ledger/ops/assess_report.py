"""What ``effects assess`` shows and writes: the self-contained HTML report and the redacted log.

Nothing here prints a value from the log. Reports carry counts, tool names (HTTP tools as
``METHOD host/template``: ids and token-like path segments replaced, no query string) and line
numbers; the redacted log replaces every value that is not structure (times, status codes, tool and
record type names) by a keyed digest, so equal values stay equal (``effects assess`` on the redacted
log finds the same duplicates and retries) while nobody without the run's secret can recover them.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import json
import math
import secrets
from typing import Any
from urllib.parse import urlsplit

from effect_ledger.errors import AssessError
from effect_ledger.ops.assess_formats import UNKNOWN_ERROR, segment

# Field names whose values are structure, not data: kept as they are.
KEEP = frozenset(
    {"type", "run_type", "name", "tool", "tool_name", "method", "status", "status_code", "level", "kind", "code",
     "object", "host", "start_time", "end_time", "startTime", "endTime", "started_at", "ended_at", "timestamp",
     "ts", "time", "@timestamp", "startTimeUnixNano", "endTimeUnixNano", "timeUnixNano", "duration",
     "duration_ms", "latency_ms", "request_time", "intent_at", "finished_at", "end", "key"}
)  # fmt: skip
# OTLP attributes whose values are structure.
KEEP_ATTRS = frozenset(
    {"gen_ai.operation.name", "gen_ai.tool.name", "mcp.method.name", "openinference.span.kind", "tool.name",
     "http.request.method", "http.method", "http.response.status_code", "http.status_code", "error.type",
     "server.address", "gen_ai.system", "gen_ai.provider.name"}
)  # fmt: skip
# Never kept in any form: credentials.
SECRET = frozenset(
    {"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key", "api_key", "apikey",
     "password", "secret", "token", "access_token", "refresh_token", "client_secret"}
)  # fmt: skip
# Error texts: only whether the outcome was unknown (a timeout, a dropped connection) survives.
ERROR_FIELDS = frozenset({"error", "statusMessage", "status_message", "message", "exception.message"})
URL_FIELDS = frozenset({"url", "uri", "http.url", "url.full", "path", "request.path", "url.path"})


#: How deep the redactor follows nested objects, arrays and JSON inside strings: a record nested deeper
#: is refused whole (``ValueError``; ``effects assess`` counts its line bad, "nested too deep", and leaves
#: it out of the redacted log) instead of recursing until Python gives up on the whole run.
MAX_DEPTH = 100


class Redactor:
    """Redacts parsed records with a secret made for this run (equal values, equal digests)."""

    def __init__(self, salt: bytes | None = None) -> None:
        self._salt = salt or secrets.token_bytes(32)

    def digest(self, value: Any) -> str:
        return "h:" + hmac.new(self._salt, str(value).encode(), hashlib.sha256).hexdigest()[:16]

    def url(self, value: str) -> str:
        parts = urlsplit(value)
        path = "/".join(s if segment(s) == s else self.digest(s) for s in parts.path.split("/"))
        host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
        return f"{parts.scheme}://{host}{path}" if parts.scheme else path

    def redact(self, value: Any, name: str = "", depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise ValueError("nested too deep")
        low = name.lower()
        if low in SECRET or low.startswith("http.request.header.authorization"):
            return "[redacted]"
        if isinstance(value, dict):
            if isinstance(value.get("key"), str) and "value" in value and len(value) == 2:  # an OTLP attribute
                k = value["key"]
                return {"key": k, "value": value["value"] if k in KEEP_ATTRS else self._attr(k, value["value"], depth)}
            return {k: self.redact(v, str(k), depth + 1) for k, v in value.items()}
        if isinstance(value, list):
            return [self.redact(v, name, depth + 1) for v in value]
        if name in KEEP or value is None or isinstance(value, bool):
            return value
        if name in ERROR_FIELDS and isinstance(value, str) and value:
            return "timeout" if UNKNOWN_ERROR.search(value) else "error"
        if isinstance(value, str):
            if name in URL_FIELDS:
                return self.url(value)
            if value[:1] in "{[":
                try:
                    inner = json.loads(value)
                except ValueError:
                    return self.digest(value)
                except RecursionError:  # deeper than the parser goes: deeper than MAX_DEPTH too
                    raise ValueError("nested too deep") from None
                return json.dumps(self.redact(inner, "", depth + 1), separators=(",", ":"))  # arguments stay JSON
        return self.digest(value)

    def _attr(self, key: str, value: Any, depth: int) -> Any:
        if key in URL_FIELDS and isinstance(value, dict) and isinstance(value.get("stringValue"), str):
            return {"stringValue": self.url(value["stringValue"])}
        if "authorization" in key.lower() or "cookie" in key.lower():
            return {"stringValue": "[redacted]"}
        return self.redact(value, "", depth + 1)


# -- the HTML report ---------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#1d2330;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em}table{border-collapse:collapse;width:100%}
th,td{border-bottom:1px solid #dde;padding:.35em .5em;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums}.pass{color:#176b2c}.fail,.fix{color:#a31515;font-weight:600}
.na{color:#7a6000}.muted{color:#667}.verdict{font-size:1.1em;padding:.8em;background:#f4f6fa;border-left:4px solid #345}
svg{background:#fafbfd;border:1px solid #e3e6ee}
"""


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _ms(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v} ms" if v < 1000 else f"{v / 1000:.1f} s"


def cell(row: dict[str, Any]) -> str:
    """A row's measurement as one line of text: num/den (share), extras."""
    if row["numerator"] is None:
        return f"not measurable from this log: {row['missing']}"
    num, den = row["numerator"], row["denominator"]
    share = f" ({num / den:.1%})" if den else ""
    extra = []
    d = row["detail"]
    if row["id"] == "window":
        extra.append(
            f"window p50 {_ms(d['p50_ms'])}, p99 {_ms(d['p99_ms'])}, max {_ms(d['max_ms'])} over {d['timed']:,}"
        )
    if row["id"] == "keyed" and d.get("below_half"):
        extra.append("below half: " + ", ".join(d["below_half"][:5]))
    if row["id"] == "stuck":
        extra.append(f"{d['noticed']} noticed, {d['unnoticed']} not")
    if row["id"] == "rhythm" and d.get("delay_p50_ms") is not None:
        extra.append(f"retry delay p50 {_ms(d['delay_p50_ms'])}")
    if row["id"] == "derived":
        extra.append(f"{d['with_time']} carry time, {d['replaced_on_retry']} replaced on a retry")
    return f"{num:,}/{den:,}{share}" + ("; " + "; ".join(extra) if extra else "")


def _histogram(series: dict[str, list[int]], title: str) -> str:
    """An inline SVG: counts per power-of-two bucket of milliseconds, one colour per series."""
    colours = ["#3565b5", "#d0782a", "#3c9a5f"]
    buckets: dict[str, list[int]] = {}
    top = 1
    for name, values in series.items():
        counts = [0] * 28
        for v in values:
            counts[min(27, max(0, int(math.log2(v)) + 1 if v > 0 else 0))] += 1
        buckets[name] = counts
        top = max(top, *counts)
    used = [i for i in range(28) if any(c[i] for c in buckets.values())] or [0]
    lo, hi = min(used), max(used)
    n = hi - lo + 1
    w, h, pad = 900, 220, 30
    bw = (w - 2 * pad) / n / max(1, len(buckets))
    parts = [
        f'<svg role="img" aria-label="{html.escape(title)}" width="{w}" height="{h + 40}" viewBox="0 0 {w} {h + 40}">'
    ]
    for si, (name, counts) in enumerate(buckets.items()):
        for i in range(lo, hi + 1):
            bh = (h - pad) * counts[i] / top
            x = pad + ((i - lo) * len(buckets) + si) * bw
            tip = f"<title>{html.escape(name)}: {counts[i]}</title>"
            parts.append(f'<rect x="{x:.1f}" y="{h - bh:.1f}" width="{bw * 0.9:.1f}" height="{bh:.1f}" '
                         f'fill="{colours[si % 3]}">{tip}</rect>')  # fmt: skip
        parts.append(f'<text x="{pad + si * 220}" y="16" fill="{colours[si % 3]}">{html.escape(name)}</text>')
    for i in range(lo, hi + 1, max(1, n // 10)):
        label = _ms(0 if i == 0 else 2 ** (i - 1))
        parts.append(f'<text x="{pad + (i - lo) * len(buckets) * bw:.1f}" y="{h + 16}" font-size="11">{label}</text>')
    parts.append(f'<text x="{w / 2 - 80}" y="{h + 34}" font-size="11">milliseconds (log2 buckets)</text></svg>')
    return "".join(parts)


def html_report(
    report: dict[str, Any], windows: list[int], delays: list[int], durations: list[int], source: str
) -> str:
    """The self-contained page: verdict, the eight rows, the arithmetic, per tool, histograms, examples."""
    e = html.escape
    ar = report["arithmetic"]
    out = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>effects assess: {e(source)}</title>",
           f"<style>{_CSS}</style></head><body><h1>effects assess: {e(source)}</h1>",
           f'<p class=muted>format {e(str(report["format"]))}, {report["lines"]:,} lines '
           f'({report["bad_lines"]["count"]:,} bad), {_fmt(report["log_days"])} days, '
           f'duplicate window {report["window_s"]:g} s</p>',
           f'<p class="verdict" id="verdict">{e(ar["verdict"])}</p>',
           "<h2>The eight rows</h2><table id=rows><tr><th>#</th><th>item</th><th>measured (num/den)</th>"
           "<th>criterion</th><th>verdict</th><th>closing it needs</th></tr>"]  # fmt: skip
    for i, r in enumerate(report["rows"], 1):
        cls = {"pass": "pass", "fail": "fail", "fix first": "fix", "not measurable": "na"}.get(r["verdict"], "muted")
        need = "a schema change" if r["needs"] == "schema" else "code or configuration"
        out.append(f"<tr><td>{i}</td><td>{e(r['item'])}</td><td>{e(cell(r))}</td><td>{e(r['criterion'])}</td>"
                   f"<td class={cls}>{e(r['verdict'])}</td><td>{need}: {e(r['fix'])}</td></tr>")  # fmt: skip
    out.append("</table><h2>The arithmetic</h2><table id=arithmetic>")
    for k, v in ar.items():
        if k != "verdict":
            shown = f"{v:.2%}" if k == "share_in_window" else _fmt(v)
            out.append(f"<tr><td>{e(k.replace('_', ' '))}</td><td class=n>{e(shown)}</td></tr>")
    out.append("</table><h2>Per tool</h2><table id=tools><tr>")
    cols = ["tool", "calls", "writes", "keyed", "ok", "unknown", "retries", "early_retries", "duplicates", "stuck"]
    out.append("".join(f"<th>{c.replace('_', ' ')}</th>" for c in cols) + "</tr>")
    for t in report["tools"]:
        out.append("<tr>" + "".join(f"<td{'' if c == 'tool' else ' class=n'}>{e(_fmt(t[c]))}</td>" for c in cols))
    out.append("</table><h2>The call&rarr;record window</h2>")
    out.append(_histogram({"call→record window": windows}, "window histogram"))
    out.append("<h2>Retry delays against call durations</h2>")
    out.append(_histogram({"retry delay": delays, "successful call duration": durations}, "retry histogram"))
    out.append("<h2>Worst examples (redacted: line numbers and tools only)</h2><table id=examples>"
               "<tr><th>what</th><th>line</th><th>tool</th><th>key</th></tr>")  # fmt: skip
    for kind, ex in report["examples"].items():
        for x in ex:
            out.append(
                f"<tr><td>{e(kind)}</td><td class=n>{x['line']}</td><td>{e(x['tool'])}</td>"
                f"<td>{e(str(x.get('key', '-')))}</td></tr>"
            )
    out.append("</table></body></html>\n")
    return "\n".join(out)


class NewFile:
    """An output written whole or not at all: into a temporary file beside it, linked into place only
    when complete, and never over an existing file (a refused or failed run leaves no trace)."""

    def __init__(self, path: str) -> None:
        import os

        if os.path.lexists(path):
            raise AssessError(f"{path} exists: not overwritten")
        folder = os.path.dirname(os.path.abspath(path))
        self.path = path
        self._ino = -1  # the inode linked into place by commit (none yet)
        self._tmp = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
        try:
            self.fp = open(self._tmp, "xb")  # noqa: SIM115 - closed by commit/abort
        except OSError as e:
            raise AssessError(f"cannot write {path}: {e.strerror or e}") from None

    def commit(self) -> None:
        import os

        self.fp.close()
        try:
            self._ino = os.stat(self._tmp).st_ino
            os.link(self._tmp, self.path)  # fails if the path appeared meanwhile: never overwrites
        except OSError as e:
            raise AssessError(f"cannot write {self.path}: {e.strerror or e}") from None
        finally:
            os.unlink(self._tmp)

    def abort(self) -> None:
        import os

        self.fp.close()
        if os.path.exists(self._tmp):
            os.unlink(self._tmp)

    def uncommit(self) -> None:
        """Remove the file :meth:`commit` linked into place (a later output of the same run failed:
        a run writes all its outputs or none). Only the link this run made: its inode is checked."""
        import os

        try:
            if os.lstat(self.path).st_ino == self._ino:
                os.unlink(self.path)
        except OSError:  # gone already
            pass
