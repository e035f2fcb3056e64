"""`LocalServers`: the queue server processes this program started on this host, and what they leave.

One object owns them from start to stop: the processes, the addresses they listen on, the token and
the pinned certificate fingerprint a client needs, and the temporary data directories made for them.
`QueuePool.local` (and through it `conveyor.local()`, `conveyor.cluster()` and the servers `map` or a
`SparkConsumerPool` start for one call) connects to them and stops them when it closes.
"""

from __future__ import annotations

import operator
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from conveyor.protocol.auth import is_loopback
from conveyor.protocol.tls import self_signed
from conveyor.server.processes import listening, start_server, stop_server


@dataclass
class LocalServers:
    """Queue server processes started here, in shard order; `stop()` ends them and removes their temporary data."""

    processes: list[subprocess.Popen[bytes]]
    addresses: list[str]
    token: str | None = None  # what a client presents (None: loopback servers without one)
    fingerprint: str | None = None  # the sha256 of their self-signed certificate, pinned by clients (None: no TLS)
    data_dir: Path | None = None  # where their durable queues stay once stopped (None: nowhere, they go with them)
    temporary_dirs: list[Path] = field(default_factory=list)  # made for them, removed by `stop()`

    @classmethod
    def start(
        cls,
        n_servers: int = 2,
        durable: bool = True,
        data_dir: str | Path | None = None,
        *,
        host: str = "127.0.0.1",
        token: str | None = None,
        tls: bool | None = None,
        fsync: str = "batch",
        temp_dir: str | Path | None = None,
        ports: Iterable[int] | None = None,
    ) -> LocalServers:
        """Start `n_servers` queue servers as child processes and wait until each listens.

        See `QueuePool.local` for the parameters. Nothing is left running or on disk when one fails
        to start: the others are stopped and the directories made for them removed.
        """
        if n_servers < 1:
            raise ValueError(f"n_servers must be >= 1, got {n_servers}")
        port_list = check_ports(ports, n_servers)
        temporary = durable and data_dir is None
        remote = not is_loopback(host)
        token = token or (secrets.token_urlsafe(32) if remote else None)
        servers = cls([], [], token=token, data_dir=Path(data_dir) if durable and data_dir is not None else None)
        certs = None  # the certificate and key: read by the servers as they start, removed once they listen
        try:
            secure: list[str] = []
            if remote if tls is None else tls:
                certs = Path(tempfile.mkdtemp(prefix="conveyor-tls-", dir=temp_dir))
                cert, key, servers.fingerprint = self_signed(certs, [host, socket.gethostname()])
                secure = ["--tls-cert", str(cert), "--tls-key", str(key)]
            for i in range(n_servers):  # all start at once, then each is waited for
                d: Path | None = None  # a transient server
                if temporary:
                    servers.temporary_dirs.append(d := Path(tempfile.mkdtemp(prefix=f"conveyor-shard{i}-", dir=temp_dir)))
                elif servers.data_dir is not None:
                    d = servers.data_dir / f"shard-{i}"
                args = ["--fsync", fsync, *(["--temporary"] if temporary else []), *secure]
                port = 0 if port_list is None else port_list[i]
                servers.processes.append(start_server(d, port, host=host, token=token, args=args))
            servers.addresses = [listening(p)[1] for p in servers.processes]
        except BaseException:
            servers.stop()
            raise
        finally:
            if certs is not None:
                shutil.rmtree(certs, ignore_errors=True)
        return servers

    def stop(self) -> None:
        """Stop the servers (SIGTERM: stores closed cleanly) and remove their temporary data; again: nothing."""
        for p in self.processes:
            stop_server(p)
        self.processes = []
        for d in self.temporary_dirs:  # the servers removed them as they stopped, unless one had to be killed
            shutil.rmtree(d, ignore_errors=True)
        self.temporary_dirs = []

    def __enter__(self) -> LocalServers:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def check_ports(ports: Iterable[int] | None, n_servers: int) -> list[int] | None:
    """`ports` as a list of one distinct TCP port per server (None: free ports are picked); a clear error for anything else."""
    if ports is None:
        return None
    if isinstance(ports, (str, bytes)) or not isinstance(ports, Iterable):
        raise ValueError(f"ports: one TCP port per server, got {ports!r}")
    out: list[int] = []
    for p in ports:
        try:
            if isinstance(p, bool):
                raise TypeError
            out.append(operator.index(p))
        except TypeError:
            raise ValueError(f"ports: {p!r} is not a TCP port number") from None
    if len(out) != n_servers:
        raise ValueError(f"ports: one per server ({n_servers}), got {out!r}")
    if any(not 1 <= p <= 65535 for p in out) or len(set(out)) != len(out):
        raise ValueError(f"ports must be distinct TCP ports (1-65535), got {out!r}")
    return out
