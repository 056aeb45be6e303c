"""Named fault points of the SDK, where a test or the demo can kill the agent process.

Set ``EFFECT_LEDGER_CRASH=<point>`` in a child process's environment and the process SIGKILLs
itself when it reaches that point: no cleanup, no flush, exactly like a reclaimed container.

* ``before_intent``  — nothing recorded, nothing sent
* ``after_intent``   — intent durable, destination not called
* ``after_call``     — the destination committed; nothing about it recorded
* ``after_executed`` — the outcome is durable (with the receipt the call returned, in the same
  write), but the caller never received it; in Kafka mode the outcome may not have reached the
  broker yet, so another host sees only the intent
"""

from __future__ import annotations

import os
import signal

BEFORE_INTENT = "before_intent"
AFTER_INTENT = "after_intent"
AFTER_CALL = "after_call"
AFTER_EXECUTED = "after_executed"
POINTS = (BEFORE_INTENT, AFTER_INTENT, AFTER_CALL, AFTER_EXECUTED)
ENV = "EFFECT_LEDGER_CRASH"


# Read once: the points sit on the SDK's hot path, and the variable is set before a child starts.
_ARMED = frozenset(p for p in os.environ.get(ENV, "").split(",") if p)


def reached(point: str) -> None:
    """Kill this process with SIGKILL if ``EFFECT_LEDGER_CRASH`` (as it was when this process
    started) names ``point``."""
    if _ARMED and point in _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
