"""docker-compose.yml, scripts/kafka.sh and the Python defaults describe the same broker: the Kafka
version pinned once in scripts/kafka.env, on 127.0.0.1:DEFAULT_PORT, single node (replication 1).
The compose services: ports published on the loopback interface only, data on named volumes, a
health check that asks the processor's lookup view, the reconciler's targets read from the same
declaration file the SDK reads, commands the CLI accepts; the image installs the built wheel.
(No Docker engine runs here: these read the files, and run what can run without one.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from effect_ledger.cli.main import main
from effect_ledger.streams.config import DEFAULT_BOOTSTRAP, DEFAULT_PORT
from effect_ledger.targets.load import load_targets

ROOT = Path(__file__).resolve().parents[2]
# A Kafka release number (3.x.y or 4.x.y) standing alone: not part of 2.24.3 or kafka_2.13.
KAFKA_VERSION_LITERAL = re.compile(r"(?<![\w.])[34]\.\d+\.\d+(?![\w.])")
# kafka.sh writes a Maven POM: its namespace URL and <modelVersion> say 4.0.0, which is no Kafka version.
NOT_KAFKA = re.compile(r"https?://\S+|<modelVersion>[^<]*</modelVersion>")


def _version_literals(text: str) -> list[str]:
    return KAFKA_VERSION_LITERAL.findall(NOT_KAFKA.sub("", text))


def _kafka_env() -> dict[str, str]:
    values: dict[str, str] = {}
    for line in (ROOT / "scripts/kafka.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"kafka.env line is not KEY=VALUE: {line!r}"
            assert key not in values, f"kafka.env sets {key} twice"
            values[key] = value
    return values


@pytest.fixture(scope="module")
def kafka_version() -> str:
    version = _kafka_env()["KAFKA_VERSION"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
    return version


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def kafka_service(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]["kafka"]  # type: ignore[no-any-return]


def published(service: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(host address, host port, container port) of each published port; "" when no address is given."""
    out = []
    for p in service.get("ports", []):
        if isinstance(p, dict):  # long syntax
            out.append((str(p.get("host_ip", "")), int(p["published"]), int(p["target"])))
        else:  # "[ip:]host:container"
            *ip, host, container = str(p).split(":")
            out.append((ip[0] if ip else "", int(host), int(container)))
    return out


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):  # compose also allows ["KEY=value", ...]
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def mounts(service: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(source, target, read-only) of each volume entry (short or long syntax)."""
    out = []
    for v in service.get("volumes", []):
        if isinstance(v, dict):
            out.append((str(v["source"]), str(v["target"]), bool(v.get("read_only", False))))
        else:
            source, target, *mode = str(v).split(":")
            out.append((source, target, bool(mode) and "ro" in mode[0].split(",")))
    return out


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


@pytest.fixture(scope="module")
def kafka_environment(kafka_service: dict[str, Any]) -> dict[str, str]:
    return environment(kafka_service)


def test_image_is_the_pinned_apache_kafka(kafka_service: dict[str, Any], kafka_version: str) -> None:
    assert kafka_service["image"] == f"apache/kafka:{kafka_version}"


def test_published_port_is_the_default(kafka_service: dict[str, Any]) -> None:
    assert ("127.0.0.1", DEFAULT_PORT, DEFAULT_PORT) in published(kafka_service)


def test_listeners_match_the_default_bootstrap(kafka_environment: dict[str, str]) -> None:
    advertised = kafka_environment["KAFKA_ADVERTISED_LISTENERS"].split(",")
    assert f"PLAINTEXT://{DEFAULT_BOOTSTRAP}" in advertised
    assert DEFAULT_BOOTSTRAP == f"127.0.0.1:{DEFAULT_PORT}"
    # The advertised address is only reachable if the broker listens on that port inside the container.
    assert f"PLAINTEXT://:{DEFAULT_PORT}" in kafka_environment["KAFKA_LISTENERS"].split(",")


def test_single_node_replication(kafka_environment: dict[str, str]) -> None:
    factors = {k: v for k, v in kafka_environment.items() if k.endswith("REPLICATION_FACTOR")}
    # A single broker cannot host the internal topics with any factor above 1.
    assert "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR" in factors
    assert "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR" in factors
    assert set(factors.values()) == {"1"}, factors
    min_isr = {k: v for k, v in kafka_environment.items() if k.endswith("MIN_ISR")}
    assert set(min_isr.values()) <= {"1"}, min_isr


def test_kafka_sh_takes_its_version_from_kafka_env() -> None:
    script = (ROOT / "scripts/kafka.sh").read_text()
    assert re.search(r'^\. "\$here/kafka\.env"$', script, re.M), "kafka.sh must source kafka.env"
    # The jars Maven resolves are the pinned version.
    assert "<artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version>" in script
    assert not re.search(r"^\s*(export\s+)?KAFKA_VERSION=", script, re.M), "kafka.sh sets its own version"


def test_kafka_sh_default_port_is_the_python_default() -> None:
    script = (ROOT / "scripts/kafka.sh").read_text()
    assert f"port=${{KAFKA_PORT:-{DEFAULT_PORT}}}" in script
    assert re.search(rf"^KAFKA_PORT \?= {DEFAULT_PORT}$", (ROOT / "Makefile").read_text(), re.M)


@pytest.mark.parametrize("path", ["scripts/kafka.sh", "scripts/with-kafka.sh", "Makefile"])
def test_no_other_kafka_version_literal(path: str) -> None:
    assert _version_literals((ROOT / path).read_text()) == []


def test_compose_version_literal_is_kafka_env(kafka_version: str) -> None:
    # Compose cannot read kafka.env for an image tag without an env file, so it holds the literal.
    assert set(_version_literals((ROOT / "docker-compose.yml").read_text())) == {kafka_version}


def test_version_pattern_catches_versions() -> None:
    # The checks above are only as good as this pattern: it must see a bare version (also in a POM),
    # and must not mistake the POM model, log4j or Scala versions in kafka.sh for one.
    assert _version_literals("image: apache/kafka:4.1.1\nv=3.9.0") == ["4.1.1", "3.9.0"]
    assert _version_literals("<version>4.0.0</version>") == ["4.0.0"]
    pom = '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
    assert _version_literals(f"{pom} kafka_2.13 log4j 2.24.3 kafka-$KAFKA_VERSION") == []


def test_services_reach_the_broker_on_a_listener_it_advertises() -> None:
    """The processor and reconciler services talk to the broker on the compose network; that
    address must be one the broker advertises, and their partition count the Python default."""
    from effect_ledger.streams.config import KafkaConfig

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    advertised = compose["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    for name in ("processor", "reconciler"):
        env = compose["services"][name]["environment"]
        assert env["KAFKA_BOOTSTRAP"].split(":")[0] in advertised, name
        assert int(env["EFFECTS_PARTITIONS"]) == KafkaConfig().partitions, name
        assert compose["services"][name]["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert compose["services"]["processor"]["command"][0] == "worker"
    assert compose["services"]["reconciler"]["command"][0] == "reconcile"


# -- the services ---------------------------------------------------------------------------------


def test_ports_are_published_on_loopback_only(compose: dict[str, Any]) -> None:
    ports = {name: published(service) for name, service in compose["services"].items()}
    assert sum(len(p) for p in ports.values()) >= 2  # not vacuous: kafka and the processor publish
    wide = {name: p for name, p in ports.items() if any(ip != "127.0.0.1" for ip, _, _ in p)}
    assert wide == {}, "a port published beyond the loopback interface (no address means every interface)"


def test_processor_publishes_its_lookup_view(compose: dict[str, Any]) -> None:
    processor = compose["services"]["processor"]
    port = int(option(processor["command"], "--web-port"))
    assert ("127.0.0.1", port, port) in published(processor)
    assert option(processor["command"], "--advertised-url") == f"http://processor:{port}"


def test_data_lives_on_named_volumes(compose: dict[str, Any], kafka_environment: dict[str, str]) -> None:
    named = set(compose.get("volumes") or {})
    kafka = mounts(compose["services"]["kafka"])
    assert [m for m in kafka if m[0] in named and m[1] == kafka_environment["KAFKA_LOG_DIRS"]], kafka
    # Formatted once for a fixed cluster id, so a restart reuses the volume instead of refusing it.
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", kafka_environment["CLUSTER_ID"])
    processor = compose["services"]["processor"]
    data_dir = option(processor["command"], "--data-dir")
    assert [m for m in mounts(processor) if m[0] in named and m[1] == data_dir], mounts(processor)


def test_every_service_command_is_accepted_by_the_cli(compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands parse with the installed CLI (a flag that no longer exists fails here), with
    the service's own environment (EFFECTS_TARGETS satisfies --targets)."""
    checked = 0
    for name, service in compose["services"].items():
        if service.get("build") is None:
            continue
        command = [str(c) for c in service["command"]]
        for key, value in environment(service).items():
            monkeypatch.setenv(key, value)
        with click.Context(main, info_name="effects") as ctx:
            sub = main.get_command(ctx, command[0])
            assert sub is not None, (name, command[0])
            sub.make_context(command[0], command[1:], parent=ctx)  # raises on an unknown or missing option
        checked += 1
    assert checked == 2


def test_targets_come_from_the_declaration_file(compose: dict[str, Any]) -> None:
    """Every service that asks destinations (reconcile, run) or spaces their checks (worker) reads
    EFFECTS_TARGETS, a file of the repository mounted read-only, that load_targets accepts."""
    users = {
        n: s for n, s in compose["services"].items() if s.get("command", [None])[0] in ("reconcile", "run", "worker")
    }
    assert {"reconciler", "processor"} <= set(users)
    for name, service in users.items():
        path = environment(service)["EFFECTS_TARGETS"]
        (source,) = [src for src, target, ro in mounts(service) if target == path and ro]
        assert source.startswith("./"), source
        targets = load_targets(ROOT / source)
        assert {t.name for t in targets} >= {"payments"}, name
        # The example shows both kinds: a destination asked by key, and one nothing can ask.
        assert {t.reconciler is None for t in targets} == {True, False}


class _Health(BaseHTTPRequestHandler):
    ready = True

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = json.dumps({"ready": self.ready} if self.path == "/health" else {}).encode()
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_processor_healthcheck_asks_the_lookup_view(
    compose: dict[str, Any], health_server: ThreadingHTTPServer
) -> None:
    """The health check is a python -c against the processor's own /health: run here against a
    real HTTP server on loopback, it passes when the view says ready and fails otherwise."""
    processor = compose["services"]["processor"]
    test = processor["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    code = test[3]
    url = f"http://127.0.0.1:{option(processor['command'], '--web-port')}/health"
    assert url in code
    port = health_server.server_address[1]

    def check(at: str) -> int:
        return subprocess.run([sys.executable, "-c", code.replace(url, at)], capture_output=True, timeout=30).returncode

    _Health.ready = True
    assert check(f"http://127.0.0.1:{port}/health") == 0
    _Health.ready = False
    assert check(f"http://127.0.0.1:{port}/health") != 0
    assert check(f"http://127.0.0.1:{port}/elsewhere") != 0
    health_server.shutdown()
    health_server.server_close()
    assert check(f"http://127.0.0.1:{port}/health") != 0  # nobody listening


def test_image_installs_the_built_wheel() -> None:
    """Two stages: one builds the wheel from the tree, the other installs that wheel with the
    [processor,metrics] extras; the source tree itself is never installed."""
    text = (ROOT / "Dockerfile").read_text()
    lines = [ln.strip() for ln in re.sub(r"\\\n", " ", text).splitlines() if ln.strip() and not ln.startswith("#")]
    assert len([ln for ln in lines if ln.startswith("FROM ")]) == 2
    assert any(re.search(r"pip wheel .*--no-deps.* \.$", ln) for ln in lines), "the first stage builds the wheel"
    installs = [ln for ln in lines if "pip install" in ln]
    assert installs and all(".whl" in ln and "[processor,metrics]" in ln for ln in installs), installs
    assert not any(re.search(r"pip install[^|&]*(\s-e\s|\s\.(\s|$))", ln) for ln in lines)
    # The first stage copies everything the wheel is built from.
    copied = {ln.split()[1] for ln in lines if ln.startswith("COPY ") and "--from" not in ln}
    assert {"effect_ledger", "schemas", "streams", "processors"} <= copied
    assert "pyproject.toml" in " ".join(ln for ln in lines if ln.startswith("COPY "))
    ignored = {ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln.strip()}
    assert not ignored & {"effect_ledger", "schemas", "streams", "processors", "pyproject.toml", "constraints.txt"}


def test_a_lookup_view_beyond_loopback_has_a_token(compose: dict[str, Any]) -> None:
    """The worker refuses to listen beyond loopback without a lookup token; compose must give one
    (required from the environment, never a default written in the file)."""
    for name, service in compose["services"].items():
        command = [str(c) for c in service.get("command", [])]
        if "--web-host" not in command:
            continue
        host = command[command.index("--web-host") + 1]
        if host in ("127.0.0.1", "localhost", "::1"):
            continue
        token = str(service.get("environment", {}).get("EFFECTS_WEB_TOKEN", ""))
        assert token.startswith("${EFFECTS_WEB_TOKEN:?"), (name, token)
