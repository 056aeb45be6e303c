"""The secured broker (``KAFKA_SECURE=1 scripts/kafka.sh up``): SASL_SSL with SCRAM-SHA-512 users, a
CA made at start, the StandardAuthorizer denying whatever no ACL allows, one super user ("admin").

``secured`` gives each test a fresh topic prefix with its topics, and principals made on demand with
exactly one role's rights (``streams.acl``), applied by the admin and visible to the principal
before the test goes on; they and their ACLs are removed afterwards.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from effect_ledger.errors import BrokerRefusedLogin
from effect_ledger.streams import rights
from effect_ledger.streams.acl import grants
from effect_ledger.streams.admin import admin_client, delete_topics, ensure_topics, list_topics, wait_ready
from effect_ledger.streams.config import KafkaConfig
from tests.services import wait_for

ROOT = Path(__file__).resolve().parents[2]
SECURITY_VARS = (
    "KAFKA_SECURITY_PROTOCOL", "KAFKA_SASL_MECHANISM", "KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD",
    "KAFKA_SSL_CAFILE",
)  # fmt: skip
#: The part each role runs, checked by ``streams.acl.NEEDS`` (roles without a start check: None).
CHECK_OF = {"agent": "agent", "worker": "worker", "reconciler": "reconciler", "sink": "sink", "operator": "decide"}


def read_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def env_of(cfg: KafkaConfig) -> dict[str, str]:
    """The environment that gives a child process ``cfg``'s broker and credentials."""
    return {
        "KAFKA_BOOTSTRAP": cfg.bootstrap,
        "EFFECTS_TOPIC_PREFIX": cfg.prefix,
        "EFFECTS_PARTITIONS": str(cfg.partitions),
        "KAFKA_SECURITY_PROTOCOL": cfg.security_protocol or "",
        "KAFKA_SASL_MECHANISM": cfg.sasl_mechanism or "",
        "KAFKA_SASL_USERNAME": cfg.sasl_username or "",
        "KAFKA_SASL_PASSWORD": cfg.sasl_password or "",
        "KAFKA_SSL_CAFILE": cfg.ssl_cafile or "",
    }


# Package scope: its brokers stop once this tier is done, not at the end of the whole run.
@pytest.fixture(scope="package")
def secure_admin() -> Iterator[KafkaConfig]:
    """The secured broker's admin settings; the broker is started for this session unless it runs
    (``KAFKA_SECURE_PORT``, default 9392, and ``KAFKA_SECURE_RUN_DIR``, default .kafka-secure)."""
    port = os.environ.get("KAFKA_SECURE_PORT", "9392")
    run = Path(os.environ.get("KAFKA_SECURE_RUN_DIR", str(ROOT / ".kafka-secure")))
    env = {k: v for k, v in os.environ.items() if k not in SECURITY_VARS}
    env.update(KAFKA_SECURE="1", KAFKA_PORT=port, KAFKA_RUN_DIR=str(run))
    script = str(ROOT / "scripts/kafka.sh")
    already = subprocess.run(["bash", script, "status"], env=env, capture_output=True).returncode == 0
    subprocess.run(["bash", script, "up"], check=True, env=env)
    try:
        admin = read_env(run / "admin.env")
        yield KafkaConfig(
            bootstrap=admin["KAFKA_BOOTSTRAP"],
            security_protocol=admin["KAFKA_SECURITY_PROTOCOL"],
            sasl_mechanism=admin["KAFKA_SASL_MECHANISM"],
            sasl_username=admin["KAFKA_SASL_USERNAME"],
            sasl_password=admin["KAFKA_SASL_PASSWORD"],
            ssl_cafile=admin["KAFKA_SSL_CAFILE"],
            partitions=3,
        )
    finally:
        if not already:
            subprocess.run(["bash", script, "down"], check=False, env=env)


class Secured:
    """One test's prefix on the secured broker, and its principals."""

    def __init__(self, admin: KafkaConfig) -> None:
        self.admin = replace(admin, prefix=f"s{uuid.uuid4().hex[:10]}.")
        self.users: list[str] = []
        self.secrets: list[str] = []

    def user(self, role: str | None, *, name: str | None = None) -> KafkaConfig:
        """A new SCRAM user with ``role``'s rights on this prefix (None: no rights at all), once it can
        log in and sees its rights."""
        from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

        name = name or f"{role or 'nobody'}-{uuid.uuid4().hex[:8]}"
        password = secrets.token_hex(16)
        self.users.append(name)
        self.secrets.append(password)
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
        admin = admin_client(self.admin)  # held until every answer is in
        upsert = [UserScramCredentialUpsertion(name, info, password.encode())]
        for fut in admin.alter_user_scram_credentials(upsert).values():
            fut.result(30)
        if role is not None:
            rights.apply(self.admin, grants([(role, f"User:{name}")], self.admin.topics))
        cfg = replace(self.admin, sasl_username=name, sasl_password=password)

        def logged_in() -> bool:
            try:
                wait_ready(cfg, 5)
                return True
            except BrokerRefusedLogin:  # the credential reaches the broker's cache shortly after
                return False

        wait_for(logged_in, 30, f"{name} logging in")
        check = CHECK_OF.get(role or "")
        if check is not None:
            wait_for(lambda: not rights.missing_rights(cfg, check), 30, f"{name}'s rights visible")
        return cfg

    def revoke(self, cfg: KafkaConfig, resource: str, name: str, operation: str) -> None:
        """Delete one ALLOW binding of ``cfg``'s principal (the ACLs changed under a running part)."""
        from confluent_kafka.admin import (
            AclBindingFilter,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        kind = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP}[resource]
        op = {"Write": AclOperation.WRITE, "Read": AclOperation.READ}[operation]
        flt = AclBindingFilter(
            kind, name, ResourcePatternType.LITERAL, f"User:{cfg.sasl_username}", None, op, AclPermissionType.ALLOW
        )
        admin = admin_client(self.admin)
        for fut in admin.delete_acls([flt]).values():
            fut.result(30)

    def close(self) -> None:
        """Remove the principals' ACLs and the prefix's topics. The SCRAM users stay (random names,
        no rights): on Kafka 4.1.1 a deleted SCRAM credential can make every SCRAM login fail once
        the broker restarts, and this broker is restarted by the next session."""
        from confluent_kafka.admin import (
            AclBindingFilter,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        admin = admin_client(self.admin)
        filters = [
            AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, f"User:{u}", None, AclOperation.ANY,
                             AclPermissionType.ANY)
            for u in self.users
        ]  # fmt: skip
        if filters:
            for fut in admin.delete_acls(filters).values():
                fut.result(30)
        delete_topics(self.admin, [t for t in list_topics(self.admin) if t.startswith(self.admin.prefix)])


@pytest.fixture
def secured(secure_admin: KafkaConfig) -> Iterator[Secured]:
    s = Secured(secure_admin)
    ensure_topics(s.admin)
    try:
        yield s
    finally:
        s.close()
