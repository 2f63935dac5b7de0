"""A two-node Ray cluster on this machine, for the tests: a head node and a second node, each a
`ray start --block` of its own (separate raylets and object stores, one CPU each), both on
127.0.0.1 with ports of their own. Token authentication with a token made for this cluster, so
that no token of the user's is read or written. ``stop`` kills both nodes' process groups."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

WAIT_NODES = """
import sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)
deadline = time.monotonic() + float(sys.argv[2])
while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.monotonic() < deadline:
    time.sleep(0.2)
sys.exit(0 if len([n for n in ray.nodes() if n["Alive"]]) >= 2 else 1)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TwoNodeCluster:
    """``start`` the head, then the second node; ``address`` for ``--ray-address``; ``env`` for
    every process that talks to it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32),
                        RAY_USAGE_STATS_ENABLED="0")
        self.nodes: list[subprocess.Popen[bytes]] = []

    def _start(self, name: str, args: list[str]) -> None:
        ray = str(Path(sys.executable).with_name("ray"))
        common = ["--num-cpus", "1", "--node-ip-address", "127.0.0.1", "--object-store-memory", str(80 << 20),
                  "--disable-usage-stats", "--block"]
        with open(self.folder / f"{name}.log", "wb") as log:
            self.nodes.append(subprocess.Popen([ray, "start", *args, *common], env=self.env, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True))

    def start(self, timeout: float = 60) -> None:
        """Start both nodes and wait until both are alive; ``RuntimeError`` with the logs' end if not."""
        self._start("head", ["--head", "--port", str(self.port), "--include-dashboard", "false",
                             "--temp-dir", str(self.folder / "ray")])
        deadline = time.monotonic() + timeout
        second = False
        while time.monotonic() < deadline:
            if any(node.poll() is not None for node in self.nodes):
                break
            if not second:
                status = subprocess.run([str(Path(sys.executable).with_name("ray")), "status", "--address",
                                         self.address], env=self.env, capture_output=True)
                if status.returncode == 0:
                    self._start("node", ["--address", self.address, "--node-manager-port", str(free_port()),
                                         "--object-manager-port", str(free_port())])
                    second = True
                    continue
                time.sleep(0.5)
                continue
            waited = subprocess.run([sys.executable, "-c", WAIT_NODES, self.address,
                                     str(max(1.0, deadline - time.monotonic()))], env=self.env, capture_output=True)
            if waited.returncode == 0:
                return
            break
        raise RuntimeError("the two-node Ray cluster did not start: " + " | ".join(
            (self.folder / f"{name}.log").read_text(errors="replace")[-300:]
            for name in ("head", "node") if (self.folder / f"{name}.log").exists()))

    def stop(self) -> None:
        """Kill both nodes, with everything they started (their own process groups)."""
        for node in reversed(self.nodes):
            try:
                os.killpg(node.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            node.wait()
        self.nodes.clear()
