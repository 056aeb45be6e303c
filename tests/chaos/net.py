"""The chaos run's machines: network namespaces on one bridge (``scripts/netns.sh``) and the three
brokers in theirs (``scripts/cluster.sh`` with ``KAFKA_CLUSTER_NET=netns``). Every side has a name
and an address on 10.77.0.0/24; "host" is the namespace the harness and the destinations run in."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NETNS = ROOT / "scripts" / "netns.sh"
CLUSTER = ROOT / "scripts" / "cluster.sh"

HOST_ADDR = "10.77.0.1"
BROKERS = {1: "n1", 2: "n2", 3: "n3"}
#: The other sides: name -> last number of its address.
SIDES = {"w1": 21, "w2": 22, "r": 41, "a": 31, "b": 32}


def addr(name: str) -> str:
    if name == "host":
        return HOST_ADDR
    if name in BROKERS.values():
        return f"10.77.0.{10 + int(name[1:])}"
    return f"10.77.0.{SIDES[name]}"


def bootstrap() -> str:
    return ",".join(f"{addr(n)}:9092" for n in BROKERS.values())


def _run(args: list[str], timeout: float = 180) -> str:
    env = {**os.environ, "KAFKA_CLUSTER_NET": "netns"}
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args[1:3])} failed: {(r.stderr or r.stdout).strip()[-800:]}")
    return r.stdout


def netns(*args: str) -> str:
    return _run(["bash", str(NETNS), *args])


def cluster(*args: str) -> str:
    return _run(["bash", str(CLUSTER), *args])


def up() -> None:
    """The bridge, every side's namespace (emptied of what an interrupted run left there), and the
    cluster (formatted if new)."""
    netns("up")
    for name, n in SIDES.items():
        netns("add", name, str(n))
        leftovers = subprocess.run(["ip", "netns", "pids", f"elc-{name}"], capture_output=True, text=True).stdout
        for pid in leftovers.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (OSError, ValueError):
                pass
    netns("heal")
    # New nodes for every run: a cluster kept from run to run held every run's topics (1,659
    # partitions a node, 9 GB, after a day of runs), and a broker killed or paused in a fault took
    # that much longer to load its logs and lead again, which the availability figures then measured.
    try:
        cluster("down")
    except RuntimeError:
        pass  # nothing running
    shutil.rmtree(cluster_dir(), ignore_errors=True)
    cluster("up")


def cluster_dir() -> Path:
    """Where ``scripts/cluster.sh`` keeps the chaos run's nodes."""
    return Path(os.environ.get("KAFKA_CLUSTER_DIR", ROOT / ".kafka-cluster-netns"))


def down() -> None:
    """The cluster stopped and every namespace gone (the cuts with them)."""
    try:
        cluster("down")
    finally:
        netns("down")


def cut(a: str, b: str) -> None:
    netns("cut", a, b)


def heal() -> None:
    netns("heal")


def in_ns(name: str, argv: list[str]) -> list[str]:
    """``argv`` run in side ``name``'s namespace ("host": as is)."""
    return argv if name == "host" else ["ip", "netns", "exec", f"elc-{name}", *argv]


def broker_pid(n: int) -> int | None:
    try:
        return int((cluster_dir() / f"n{n}" / "node.pid").read_text().strip())
    except (OSError, ValueError):
        return None
