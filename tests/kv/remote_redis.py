"""A real redis-server for the remote-tier tests: on 127.0.0.1 at a free port, no persistence, bounded by
its own LRU as the tier's documentation asks; skipped with the reason when the binary is missing."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self, workdir, port: int | None = None, tls: bool = False, password: str | None = None):
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (apt-get install -y redis-server; `make install` "
                        "does it when run as root)")
        self.binary, self.workdir = binary, workdir
        self.port = port or free_port()
        self.tls, self.password = tls, password
        self.proc: subprocess.Popen | None = None
        self.cert = self._make_cert() if tls else None
        self.start()

    @property
    def url(self) -> str:
        if self.tls:  # the store's self-signed certificate is the client's CA
            return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.cert}&ssl_cert_reqs=required"
        return f"redis://127.0.0.1:{self.port}/0"

    def _make_cert(self) -> str:
        openssl = shutil.which("openssl")
        if openssl is None:
            pytest.skip("openssl is not installed: no certificate for the TLS store")
        cert, key = self.workdir / "cert.pem", self.workdir / "key.pem"
        subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                        str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
                        "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
        return str(cert)

    def _args(self) -> list[str]:
        args = ["--requirepass", self.password] if self.password else []
        if not self.tls:
            return args + ["--port", str(self.port)]
        key = str(self.workdir / "key.pem")
        return args + ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", self.cert,
                       "--tls-key-file", key, "--tls-ca-cert-file", self.cert, "--tls-auth-clients", "no"]

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--bind", "127.0.0.1", *self._args(), "--save", "", "--appendonly", "no",
             "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:  # until it accepts connections
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.02)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def client(self):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)


def wait_for(condition, timeout_s: float = 20.0) -> bool:
    """Polls a condition (a background thread's doing) until it holds or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
