"""The service harness for integration tests (``effect_ledger.processors.supervise``), plus ``wait_for``."""

from __future__ import annotations

import time
from typing import Any

from effect_ledger.processors.supervise import Processor, Reconcilers, Service, free_port

__all__ = ["Processor", "Reconcilers", "Service", "free_port", "wait_for"]


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
