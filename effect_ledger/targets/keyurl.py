"""URLs that carry an effect key, sent exactly as built.

The key goes in as ``key_path_segment(key)`` (``effect_ledger.core.keys``), and the URL is handed
to aiohttp as already encoded: given a ``str``, aiohttp decodes ``%2E`` and then resolves ``.`` and
``..`` segments, so ``/effects/%2E%2E`` would still be sent as ``/``."""

from __future__ import annotations

from yarl import URL

from effect_ledger.core.keys import key_path_segment
from effect_ledger.targets.evidence import origin

__all__ = ["key_url", "origin"]

# Letters only: quoting and normalising the rest of the template leave it as it is.
_SLOT = "effectledgerkeyslot"


def key_url(template: str, key: str, **fields: str) -> URL:
    """``template`` with every ``{key}`` replaced by the key's path segment and the other
    ``{name}`` fields by ``fields``. The template itself is normalised like any URL given to aiohttp;
    the key's segment is not touched. Raises ``ValueError`` on a template that cannot be filled in."""
    try:
        filled = template.format(key=_SLOT, **fields)
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(f"url template {template!r}: {type(e).__name__}: {e}") from None
    return URL(str(URL(filled)).replace(_SLOT, key_path_segment(key)), encoded=True)
