"""``effects console``: a small web app over the operator views (``effect_ledger.processors.ops``),
server-rendered, with its CSS and JavaScript shipped in the package (nothing fetched at run time)."""
