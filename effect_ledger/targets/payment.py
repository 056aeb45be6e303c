"""The ``payment`` target kind: a payment API shaped like Stripe's.

**Key placement.** The effect key travels twice with the call (``PaymentSearch.place``): in the
``Idempotency-Key`` header, which the provider deduplicates for 24 hours (a retry with the same key
gets the original object back, marked ``Idempotent-Replayed: true``), and in the object's metadata
(``metadata[effect_key]``), which it keeps for as long as the object exists.

**Lookup.** The reconciler searches the objects by that metadata with the provider's search query
syntax, ``GET {api}/v1/{object}/search?query=metadata['effect_key']:'KEY'``, through every page
(``has_more`` / ``next_page``). A hit is Found, with the provider's own object id as the receipt.
The search index lags (Stripe documents "typically within a minute"): an empty search is Absent
only once ``search_lag`` has passed since the call could last have taken effect
(``effect_ledger.targets.search``).

A create answered with ``Idempotent-Replayed: true`` is the original payment; ``recorded`` marks it
so in what the ledger records.

**Key retention.** The provider forgets idempotency keys after 24 hours (``key_retention``,
default ``"24h"``). Past it, a retry with the same key would be a second payment, so nothing may
rely on the provider's deduplication any more: ``judge`` escalates an "absent" answered past the
retention (the key may have been forgotten), and the key is never replayed to ask
(``effect_ledger.targets.ask``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from yarl import URL

from effect_ledger.targets.search import KeySearch, Page, Reading

DEFAULT_OBJECT = "payment_intents"
DEFAULT_METADATA_KEY = "effect_key"
DEFAULT_SEARCH_LAG = "60s"  # Stripe: "data is searchable ... typically within 1 minute"
SEARCH_LIMIT = 100  # Stripe's largest page


REPLAYED_HEADER = "Idempotent-Replayed"


def recorded(obj: Mapping[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
    """What to record of a create call's answer: the object, with ``idempotent_replayed: true`` when
    the provider answered from its idempotency-key store (``Idempotent-Replayed: true``): the
    original payment, under its own id, not a second one. The trace then shows that the provider's
    deduplication, not the ledger, stopped a second payment."""
    replayed = headers.get(REPLAYED_HEADER, "").strip().lower() == "true"
    return {**obj, "idempotent_replayed": True} if replayed else dict(obj)


def search_string(value: str) -> str:
    """``value`` as a quoted string of Stripe's search query language (quotes and backslashes
    escaped with a backslash)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class PaymentSearch(KeySearch):
    """Finds a payment by the effect key in its metadata (see the module docstring).

    ``object``: the searchable resource (``payment_intents``, ``charges``, ``customers``, ...);
    ``metadata_key``: the metadata field holding the key."""

    def __init__(
        self, api: str, *, object: str = DEFAULT_OBJECT, metadata_key: str = DEFAULT_METADATA_KEY, **kw: Any
    ) -> None:
        super().__init__(api, **kw)
        if not object.replace("_", "").isalnum() or not object.islower():
            raise ValueError(f"object {object!r} must be a resource name such as 'payment_intents'")
        if not metadata_key or not metadata_key.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"metadata_key {metadata_key!r} must be letters, digits, '_' or '-'")
        self.object = object
        self.metadata_key = metadata_key
        self._path = f"{self.api.path.rstrip('/')}/v1/{object}/search"

    def place(self, key: str, params: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
        """The headers and form parameters of a create call carrying ``key``: ``Idempotency-Key`` and
        ``metadata[<metadata_key>]`` added to ``params`` (a copy)."""
        return {"Idempotency-Key": key}, {**params, f"metadata[{self.metadata_key}]": key}

    def first_url(self, key: str) -> URL:
        query = f"metadata[{search_string(self.metadata_key)}]:{search_string(key)}"
        return self.api.with_path(self._path).with_query({"query": query, "limit": str(SEARCH_LIMIT)})

    def read_page(self, asked: URL, body: Any, key: str) -> Reading:
        def bad(why: str, answered: str = self._path) -> Reading:
            return Reading(self._path, answered, why)

        if not isinstance(body, dict) or body.get("object") != "search_result":
            return bad("not a search_result")
        if not isinstance(body.get("url"), str):
            return bad("a search_result without its url")
        data, more, token = body.get("data"), body.get("has_more"), body.get("next_page")
        if not isinstance(data, list) or not isinstance(more, bool):
            return bad("a search_result without a data list and has_more", body["url"])
        if more and (not isinstance(token, str) or not token):
            return bad("has_more without a next_page", body["url"])
        matches = []
        for obj in data:
            meta = obj.get("metadata") if isinstance(obj, dict) else None
            oid = obj.get("id") if isinstance(obj, dict) else None
            if not isinstance(oid, str) or not oid or not isinstance(meta, dict):
                return bad("a result without an id and metadata", body["url"])
            if meta.get(self.metadata_key) == key:  # the search matched; the key must be exactly ours
                matches.append((oid, obj))
        nxt = asked.update_query({"page": token}) if more and isinstance(token, str) else None
        # Stripe names the search a result answers by its path (the page token is not echoed).
        return Reading(self._path, body["url"], None, Page(matches, nxt))


__all__ = [
    "DEFAULT_METADATA_KEY", "DEFAULT_OBJECT", "DEFAULT_SEARCH_LAG", "REPLAYED_HEADER", "PaymentSearch", "recorded",
    "search_string",
]  # fmt: skip
