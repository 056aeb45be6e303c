"""SASL/SSL settings reach both Kafka clients: confluent-kafka (relay, reconcilers, tools) and
faust/aiokafka (the ledger processor)."""

from __future__ import annotations

import ssl

import faust
import pytest

from effect_ledger.processors.processor import faust_credentials
from effect_ledger.streams.config import KafkaConfig


def test_plaintext_needs_no_credentials() -> None:
    assert faust_credentials(KafkaConfig()) is None
    assert "security.protocol" not in KafkaConfig().confluent()


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_reaches_both_clients(mechanism: str) -> None:
    cfg = KafkaConfig(
        security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism, sasl_username="svc", sasl_password="s3cret"
    )
    conf = cfg.confluent()
    assert (conf["security.protocol"], conf["sasl.mechanism"], conf["sasl.username"], conf["sasl.password"]) == (
        "SASL_PLAINTEXT",
        mechanism,
        "svc",
        "s3cret",
    )
    creds = faust_credentials(cfg)
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.username, creds.password, creds.mechanism.value) == ("svc", "s3cret", mechanism)
    assert creds.protocol.value == "SASL_PLAINTEXT"


def test_sasl_ssl_carries_a_tls_context() -> None:
    cfg = KafkaConfig(security_protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username="u", sasl_password="p")
    creds = faust_credentials(cfg)
    assert isinstance(creds, faust.SASLCredentials)
    assert isinstance(creds.ssl_context, ssl.SSLContext)
    assert creds.protocol.value == "SASL_SSL"


def test_ssl_only() -> None:
    creds = faust_credentials(KafkaConfig(security_protocol="SSL"))
    assert isinstance(creds, faust.SSLCredentials)
    assert KafkaConfig(security_protocol="SSL", ssl_cafile="/ca.pem").confluent()["ssl.ca.location"] == "/ca.pem"
