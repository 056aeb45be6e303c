"""``effects tail``'s read model: the state changes of ``effects.state`` as they arrive, filtered by
state and target."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator

from effect_ledger.core.model import EffectState, State
from effect_ledger.errors import DecodeError
from effect_ledger.ops.sources import follow_topic
from effect_ledger.streams.config import KafkaConfig
from effect_ledger.streams.schema_topic import kafka_codec


def parse_states(names: Iterable[str]) -> set[str]:
    """State names as given (any case) -> their values; an unknown one is a ``ValueError``."""
    out = set()
    for s in names:
        if s.upper() not in State.__members__:
            raise ValueError(f"--state {s!r}: one of {', '.join(State.__members__)}")
        out.add(s.upper())
    return out


def follow_states(
    cfg: KafkaConfig,
    *,
    states: set[str] | None = None,
    targets: set[str] | None = None,
    give_up_s: float,
    from_beginning: bool = False,
    stop: threading.Event | None = None,
) -> Iterator[EffectState]:
    """Every state record of ``effects.state`` from now on (or from the oldest retained), in the
    given states and targets (empty or None: all). A record that does not decode is skipped. A
    broker gone for longer than ``give_up_s`` raises ``SourceError`` (``follow_topic``)."""
    codec = kafka_codec(cfg)  # a newer release's states too: learned from effects.schemas
    for value in follow_topic(cfg, cfg.topics.state, give_up_s=give_up_s, from_beginning=from_beginning, stop=stop):
        try:
            st = codec.decode(value)
        except DecodeError:
            continue
        if not isinstance(st, EffectState):
            continue
        if (states and st.state.value not in states) or (targets and st.target not in targets):
            continue
        yield st
