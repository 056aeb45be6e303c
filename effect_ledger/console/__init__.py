"""``effects console``: a small web app over the operator views (``effect_ledger.ops``), with its
CSS and JavaScript shipped in the package. May import ``ops``, ``sdk``, ``streams``, ``core``."""
