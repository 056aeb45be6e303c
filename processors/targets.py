"""Target configuration for the services, from command-line specs.

``--reconciler payments=https://gw/refunds/by-key/{key}`` gives target ``payments`` an HTTP
reconciler; ``--honours-keys payments`` says the destination deduplicates keys (the agent may
replay them); ``--targets package.module:NAME`` loads a list of ``streams.reconcile.Target``
objects (for callable reconcilers and custom settings).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from processors.reconcilers import HttpReconciler
from streams.reconcile import Target


class TargetSpecError(ValueError):
    pass


def parse_targets(
    reconcilers: Iterable[str], honours_keys: Iterable[str] = (), module: str | None = None
) -> dict[str, Target]:
    targets: dict[str, Target] = {}
    if module:
        mod_name, _, attr = module.partition(":")
        try:
            loaded = getattr(importlib.import_module(mod_name), attr or "TARGETS")
        except (ImportError, AttributeError) as e:
            raise TargetSpecError(f"--targets {module}: {e}") from e
        for t in loaded:
            if not isinstance(t, Target):
                raise TargetSpecError(f"--targets {module}: {t!r} is not a streams.reconcile.Target")
            targets[t.name] = t
    honour = set(honours_keys)
    for spec in reconcilers:
        name, sep, url = spec.partition("=")
        if not sep or not name or "{key}" not in url:
            raise TargetSpecError(f"--reconciler {spec!r}: expected TARGET=URL with {{key}} in the URL")
        targets[name] = Target(name, reconciler=HttpReconciler(url, name=f"http:{name}"), honours_keys=name in honour)
    for name in honour - set(targets):
        targets[name] = Target(name, honours_keys=True)
    return targets
