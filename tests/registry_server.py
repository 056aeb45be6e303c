"""A minimal Confluent-compatible Schema Registry for tests, over real HTTP on loopback.

No registry server can be run here (Karapace is not served by the package index; Apicurio's app is
a Quarkus build whose runnable jar is not published to Maven Central; Confluent's is not served), so
the tests use this stand-in for the REST calls that registering and framing need, and read what
effect-ledger writes with confluent-kafka's own ``SchemaRegistryClient`` + ``AvroDeserializer``:

- ``POST /subjects/{subject}/versions`` ``{"schema": "..."}`` -> ``{"id": N}`` (one id per distinct
  schema across subjects, as Confluent's registry does);
- ``GET /schemas/ids/{id}`` -> ``{"schema": "...", "schemaType": "AVRO"}``, 404 ``40403`` if unknown;
- ``GET /subjects`` and ``GET /subjects/{subject}/versions``.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class RegistryServer:
    """Start with ``with RegistryServer() as r:``; ``r.url`` is its base URL."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}  # canonical schema text -> id
        self.schemas: dict[int, str] = {}
        self.subjects: dict[str, list[int]] = {}
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path = urllib.parse.urlparse(self.path).path.rstrip("/")
                server.requests.append(("GET", path))
                parts = [urllib.parse.unquote(p) for p in path.split("/")[1:]]
                with server._lock:
                    if parts[:2] == ["schemas", "ids"] and len(parts) == 3 and parts[2].isdigit():
                        text = server.schemas.get(int(parts[2]))
                        if text is None:
                            return self._answer(404, {"error_code": 40403, "message": "Schema not found"})
                        return self._answer(200, {"schema": text, "schemaType": "AVRO"})
                    if parts == ["subjects"]:
                        return self._answer(200, sorted(server.subjects))
                    if len(parts) == 3 and parts[0] == "subjects" and parts[2] == "versions":
                        versions = server.subjects.get(parts[1])
                        if versions is None:
                            return self._answer(404, {"error_code": 40401, "message": "Subject not found"})
                        return self._answer(200, list(range(1, len(versions) + 1)))
                return self._answer(404, {"error_code": 404, "message": "not found"})

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                path = urllib.parse.urlparse(self.path).path.rstrip("/")
                server.requests.append(("POST", path))
                parts = [urllib.parse.unquote(p) for p in path.split("/")[1:]]
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                if len(parts) != 3 or parts[0] != "subjects" or parts[2] != "versions":
                    return self._answer(404, {"error_code": 404, "message": "not found"})
                try:
                    canonical = json.dumps(json.loads(body["schema"]), sort_keys=True)
                except (KeyError, ValueError):
                    return self._answer(422, {"error_code": 42201, "message": "Invalid schema"})
                with server._lock:
                    sid = server.ids.get(canonical)
                    if sid is None:
                        sid = server.ids[canonical] = len(server.ids) + 1
                        server.schemas[sid] = body["schema"]
                    versions = server.subjects.setdefault(parts[1], [])
                    if sid not in versions:
                        versions.append(sid)
                return self._answer(200, {"id": sid})

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> RegistryServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
