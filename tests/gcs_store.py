"""Helpers (not tests): a real GCS-compatible server on 127.0.0.1 (the ``gcp-storage-emulator``
package's JSON API, objects kept in memory) behind the counting proxy of tests/object_store.py, for
gcsfs to talk to as it talks to Google Cloud Storage.

    with GcsStore() as store:             # the emulator on a free port, the proxy in front of it
        store.make_bucket("bkt")
        store.options                     # fsspec storage_options: the proxy's endpoint, anonymous
        store.environment                 # the same, as a shell's environment gives it to the CLI
        store.proxy.requests              # [(method, path, range header), ...] seen so far

Importing this module sets ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` unless it is set: gcsfs then
uses its JSON API filesystem alone, instead of first asking a gRPC control API (which no emulator
serves) for each bucket's layout and waiting out its timeout. It must be imported before gcsfs.
It also points Google's metadata server at a closed port of 127.0.0.1, so that a test that looks
for default credentials never sends a request off this machine.
"""

from __future__ import annotations

import os
import socket
import threading
from functools import partial
from http.server import HTTPServer
from typing import Any

from tests.object_store import CountingProxy

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
PROJECT = "packload-test"


def closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on (bound, then let go)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# google-auth looks for a metadata server when it finds no credentials: here it finds none, at once.
_NO_METADATA_SERVER = {"GCE_METADATA_HOST": f"127.0.0.1:{closed_port()}", "GCE_METADATA_IP": f"127.0.0.1:{closed_port()}",
                       "NO_GCE_CHECK": "true", "GCE_METADATA_TIMEOUT": "1", "GCE_METADATA_DETECT_RETRIES": "1"}
for _key, _value in _NO_METADATA_SERVER.items():
    os.environ.setdefault(_key, _value)


class _EmulatorServer(HTTPServer):
    """The emulator answers one request at a time; a deeper queue lets many connect at once."""

    request_queue_size = 128


class GcsStore:
    """gcp-storage-emulator on a free port of 127.0.0.1, a ``CountingProxy`` in front of it."""

    def __init__(self, delay_s: float = 0.0) -> None:
        import gcsfs  # noqa: PLC0415
        from gcp_storage_emulator.server import RequestHandler  # noqa: PLC0415 - a dev extra; tests skip without it
        from gcp_storage_emulator.storage import Storage  # noqa: PLC0415

        if gcsfs.GCSFileSystem.__name__ != "GCSFileSystem":
            raise RuntimeError("gcsfs was imported before tests/gcs_store.py, with its gRPC features on: import "
                               "tests.gcs_store first, or set GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false")
        self.storage = Storage(use_memory_fs=True)
        self.server = _EmulatorServer(("127.0.0.1", 0), partial(RequestHandler, self.storage))
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()
        self.proxy = CountingProxy(("127.0.0.1", self.server.server_address[1]), delay_s)
        self.options: dict[str, Any] = {"endpoint_url": self.proxy.endpoint, "token": "anon", "project": PROJECT,
                                        "skip_instance_cache": True}

    @property
    def environment(self) -> dict[str, str]:
        """What a user exports so that the CLI reaches this server: gcsfs reads the endpoint from
        ``STORAGE_EMULATOR_HOST``, fsspec the other options from ``FSSPEC_GS_<OPTION>``."""
        return {"STORAGE_EMULATOR_HOST": self.proxy.endpoint, "FSSPEC_GS_TOKEN": "anon",
                "FSSPEC_GS_PROJECT": PROJECT, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}

    def filesystem(self) -> Any:
        import gcsfs  # noqa: PLC0415

        return gcsfs.GCSFileSystem(**self.options)

    def make_bucket(self, name: str) -> None:
        """Create bucket ``name`` (nothing when it is there already)."""
        fs = self.filesystem()
        if not fs.exists(name):
            fs.mkdir(name)

    def close(self) -> None:
        self.proxy.close()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> GcsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
