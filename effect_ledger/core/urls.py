"""URLs as they may be shown: in an Unknown's reason (written into the ledger's events, which are
immutable and replicated), in an error message, on a terminal, in a report.

``safe_url`` keeps what tells a person which resource was asked (scheme, host, port, path, the
names of the query's parameters) and hides what may be a secret: the password of ``user:password@``
(a user name alone, ``TOKEN@host``, is hidden whole, since that is where some APIs put their token),
the value of every query parameter (``?token=...``, ``?sig=...``: an API's own way of passing a key),
and the fragment. ``scrub`` applies the same to a message that quotes a URL, such as an HTTP
client's exception text.
"""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit, urlunsplit

__all__ = ["MASK", "credentials_in", "safe_url", "scrub"]

MASK = "***"
# A query value shorter than this is not searched for in free text by ``scrub``: replacing every
# "1" of a message because a URL said ``page=1`` would garble it, and so short a value is no secret.
_MIN_SECRET = 4


def _split(url: str) -> SplitResult | None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return None
    return parts


def credentials_in(url: str) -> bool:
    """Whether ``url`` carries a user name or password before its host (``scheme://user:pw@host``)."""
    parts = _split(url)
    if parts is None:
        return "@" in url.split("?", 1)[0].split("#", 1)[0]
    return "@" in parts.netloc


def _netloc(parts: SplitResult) -> str:
    if "@" not in parts.netloc:
        return parts.netloc
    userinfo, host = parts.netloc.rsplit("@", 1)
    if ":" in userinfo:
        return f"{userinfo.split(':', 1)[0]}:{MASK}@{host}"
    return f"{MASK}@{host}"


def _query(query: str) -> str:
    out = []
    for pair in query.split("&"):
        name, eq, value = pair.partition("=")
        out.append(f"{name}={MASK}" if eq and value else pair)
    return "&".join(out)


def safe_url(url: str) -> str:
    """``url`` without its secrets (see the module docstring); text that is not a URL comes back as it is."""
    if "://" not in url and "?" not in url and "@" not in url:
        return url
    parts = _split(url)
    if parts is None:
        return "(an unparsable URL)"
    if "@" not in parts.netloc and not parts.query and not parts.fragment:
        return url  # nothing to hide; urlunsplit would also turn sqlite:///PATH into sqlite:/PATH
    return urlunsplit(
        parts._replace(netloc=_netloc(parts), query=_query(parts.query), fragment=MASK if parts.fragment else "")
    )


def scrub(text: str, *urls: object) -> str:
    """``text`` with each of ``urls`` (str or yarl.URL) shown as ``safe_url`` shows it, and with the
    URLs' passwords and query values removed wherever else they appear (an exception's message may
    quote them decoded or in pieces)."""
    for url in urls:
        raw = str(url)
        safe = safe_url(raw)
        if raw != safe:
            text = text.replace(raw, safe)
        parts = _split(raw)
        if parts is None:
            continue
        secrets = {parts.password or "", parts.username or "" if parts.password is None else ""}
        secrets |= {value for _, _, value in (p.partition("=") for p in parts.query.split("&"))}
        for secret in sorted(secrets, key=len, reverse=True):
            if len(secret) >= _MIN_SECRET:
                text = text.replace(secret, MASK)
    return text
