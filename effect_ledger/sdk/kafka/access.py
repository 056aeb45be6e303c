"""What an agent's Kafka credential allows, checked before the ledger writes or calls anything.

``Ledger.open(kafka=...)`` asks the broker (``streams.rights``) whether this principal may write
``effects.events`` and the schemas; ``Ledger.decide`` whether it may write ``effects.decisions``.
A right it lacks is ``NotAuthorized`` at once, the file untouched; a broker that refuses the
credentials or the TLS handshake is ``BrokerRefusedLogin``. A broker that does not answer within
``wait`` seconds is no reason to refuse: the outbox exists so that an agent works through a Kafka
outage. The relay then meets any refusal itself (``Relay.forbidden``), and ``execute`` refuses to
call a destination from then on.
"""

from __future__ import annotations

import asyncio
import logging

from effect_ledger.errors import BrokerRefusedLogin, BrokerUnavailable
from effect_ledger.streams.config import KafkaConfig

log = logging.getLogger("effect_ledger.access")

#: How long opening a ledger waits for a broker to answer the check (then it is skipped).
OPEN_CHECK_WAIT_S = 2.0


def _check(cfg: KafkaConfig, need: str, what: str, wait: float) -> None:
    from confluent_kafka import KafkaException

    from effect_ledger.streams import rights
    from effect_ledger.streams.admin import wait_ready

    try:
        wait_ready(cfg, wait)
    except BrokerRefusedLogin:
        raise
    except BrokerUnavailable as e:
        log.warning("%s: rights not checked (%s); the relay will meet any refusal", what, e)
        return
    try:
        rights.require(cfg, need, what, timeout=wait)
    except KafkaException as e:  # the broker went away between the two requests
        log.warning("%s: rights not checked (%s); the relay will meet any refusal", what, e)


async def check(cfg: KafkaConfig, need: str, what: str, wait: float = OPEN_CHECK_WAIT_S) -> None:
    """Raise ``NotAuthorized`` when Kafka's ACLs deny ``need`` (a key of ``streams.acl.NEEDS``) to
    this client, ``BrokerRefusedLogin`` when the broker refuses its login; skip the check when no
    broker answers within ``wait`` seconds."""
    await asyncio.to_thread(_check, cfg, need, what, wait)
