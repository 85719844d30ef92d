"""The test cluster's certificates pass the checks Python 3.13's ssl makes by default (our images' Python)."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

from grpojob_testing import pki


def test_a_strict_client_accepts_the_api_servers_certificate(tmp_path: Path) -> None:
    certs = pki.generate(tmp_path, "10.96.0.1", ["kubernetes"])
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(certs.serving_cert, certs.serving_key)
    client_context = ssl.create_default_context(cafile=str(certs.ca_cert))
    client_context.verify_flags |= ssl.VERIFY_X509_STRICT  # the default from Python 3.13 on

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            connection, _ = listener.accept()
            with server_context.wrap_socket(connection, server_side=True) as tls:
                tls.recv(1)

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            client_context.wrap_socket(raw, server_hostname="kubernetes") as tls,
        ):
            assert tls.getpeercert()["subject"] == ((("commonName", "kube-apiserver"),),)
            tls.send(b"x")
        server.join(timeout=10)
