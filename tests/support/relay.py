"""A man in the middle, for the TLS tests: a TCP relay that flips one byte of what the client sends.

It flips it once `after` bytes have gone by (past the handshakes). Run as a script on a host of the
multi-host bed:

    python tests/support/relay.py LISTEN_IP LISTEN_PORT TARGET_IP TARGET_PORT AFTER
"""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress


class Relay:
    """A man in the middle: it forwards both ways, and flips one byte of what the client sends.

    It flips it once `after` bytes have gone by (after the handshakes).
    """

    def __init__(self, target: tuple[str, int], after: int, listen: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.target, self.after = target, after
        self.listener = socket.create_server(listen)
        self.port = self.listener.getsockname()[1]
        self.flipped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                a, _ = self.listener.accept()
            except OSError:
                return
            b = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(a, b, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(b, a, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        seen = 0
        try:
            while chunk := src.recv(65536):
                if upstream and not self.flipped and seen + len(chunk) > self.after:
                    at = max(0, self.after - seen)
                    chunk = chunk[:at] + bytes([chunk[at] ^ 0x20]) + chunk[at + 1 :]
                    self.flipped = True
                seen += len(chunk)
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()


@contextmanager
def relay(target: str, after: int) -> Iterator[Relay]:
    host, port = target.split("://")[1].rsplit(":", 1)
    r = Relay((host, int(port)), after)
    try:
        yield r
    finally:
        r.close()


if __name__ == "__main__":
    listen_ip, listen_port, target_ip, target_port, after = sys.argv[1:6]
    r = Relay((target_ip, int(target_port)), int(after), (listen_ip, int(listen_port)))
    print(f"relaying {listen_ip}:{r.port} to {target_ip}:{target_port}", flush=True)
    threading.Event().wait()  # until killed
