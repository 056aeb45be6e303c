"""Only the destination's own answer is evidence: the one rule every built-in lookup goes through.

A reconciler turns a reply into a tentative answer (``Found``, ``Absent``, ``Unknown``); before
that answer is believed, ``admit`` weighs where it came from. ``Absent`` lets the ledger run the
call again, so a mistaken ``Absent`` pays twice; a mistaken ``Found`` closes an effect that never
happened. Both need the reply to be the destination's own word about the resource the lookup named:

* **another resource answered** (``Provenance.answered`` is not ``Provenance.asked``): a proxy, a
  login page, a mailbox other than the declared one, another table. Unknown, whatever it said.
* **after a redirect** (``redirected``): the page that answered is not the one the lookup names,
  whichever redirect setting let it be followed. Unknown: never Absent, never a receipt.
* **not in the shape the kind expects** (``shape_error``): an HTML error page with status 200, a
  search result without the fields a match must have. Unknown.
* **the destination keeps nothing that could show absence** (``sees_absence=False``): a mailbox
  declared to keep no sent copy. A match is still a receipt, but "no match" proves nothing:
  Unknown, which the ledger retries and then escalates to a person.

Everything else passes unchanged. The reason of a refused answer says what was refused and why, and
what the reply would have meant, so a person reading the escalation sees the whole story.

Kinds call it like this (``where`` strings are the kind's own canonical names of a resource: a
URL, ``imap://host:port/Sent``, ``sql:table``)::

    answer = admit(tentative, Provenance(asked=url, answered=final_url, redirected=hops > 0))

``redirect_refusal`` is the HTTP half of the rule that is decided before anything is sent: whether
a redirect may be followed at all (the headers, an API key, go to the lookup's own origin only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from yarl import URL

from effect_ledger.core.reconcile import Absent, Answer, Found, Unknown
from effect_ledger.core.urls import safe_url

__all__ = [
    "MAX_REDIRECTS",
    "Provenance",
    "Redirects",
    "admissible",
    "admit",
    "origin",
    "redirect_refusal",
]

MAX_REDIRECTS = 5  # same-origin redirects followed for one lookup (with redirects="same-origin")

Redirects = Literal["none", "same-origin"]


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where an answer came from, as the lookup saw it.

    ``asked``: the resource the lookup named (the URL with the key filled in, the mailbox, the
    table). ``answered``: the resource whose reply came back (the final URL after redirects, the
    mailbox the server selected). ``redirected``: the reply came after at least one redirect.
    ``shape_error``: why the reply is not in the shape the kind expects (None: it is).
    ``sees_absence``: False when the destination keeps no record that could show absence (a
    mailbox without a sent copy): then only a match counts.
    """

    asked: str
    answered: str
    redirected: bool = False
    shape_error: str | None = None
    sees_absence: bool = True


def admissible(provenance: Provenance) -> str | None:
    """Why no answer with this provenance may count, Absent or Found (None: it may)."""
    if provenance.redirected:
        answered = safe_url(provenance.answered)
        return f"the answer came after a redirect (to {answered}); only the page the lookup names answers"
    if provenance.answered != provenance.asked:
        # Compared as given, shown without secrets (the reason goes into the ledger's events).
        answered, asked = safe_url(provenance.answered), safe_url(provenance.asked)
        return f"the answer came from {answered}, not from {asked}, which the lookup names"
    if provenance.shape_error is not None:
        return f"the answer is not in the expected shape: {provenance.shape_error}"
    return None


def admit(answer: Answer, provenance: Provenance) -> Answer:
    """``answer`` as evidence: unchanged when it is the named destination's own answer in the
    expected shape, otherwise ``Unknown`` (never ``Absent``, never ``Found``) saying why."""
    if isinstance(answer, Unknown):
        return answer
    why = admissible(provenance)
    if why is not None:
        return Unknown(f"not evidence: {why} (it said: {_said(answer)})")
    if isinstance(answer, Absent) and not provenance.sees_absence:
        return Unknown(
            f"{safe_url(provenance.asked)} keeps no record that could show the effect is absent; nobody can tell "
            f"(it said: {_said(answer)})"
        )
    return answer


def _said(answer: Found | Absent) -> str:
    if isinstance(answer, Found):
        return f"found {answer.receipt_id[:200]!r}"
    return f"absent{': ' + answer.reason[:200] if answer.reason else ''}"


def origin(url: URL) -> tuple[str, str, int | None]:
    """Scheme, host and port (the default port when none is written): what a redirect or a header
    must not leave."""
    return (url.scheme.lower(), (url.host or "").lower(), url.port)


def redirect_refusal(policy: Redirects, nxt: URL | None, home: tuple[str, str, int | None], hop: int) -> str | None:
    """Why a redirect is not followed (None: follow it). Following one never makes its answer
    evidence (``admit`` refuses it); it only lets the reason say what the destination answered."""
    if nxt is None:
        return "no usable Location; not followed"
    if origin(nxt) != home:
        return "another origin; never followed (only the destination's own answer counts)"
    if policy == "none":
        return 'not followed (redirects = "none"; "same-origin" follows it)'
    if hop >= MAX_REDIRECTS:
        return f"more than {MAX_REDIRECTS} redirects; not followed"
    return None
