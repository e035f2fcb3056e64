"""Which Host headers the dashboard answers: the names it was told, compared as written.

A page of another site can reach a dashboard by a name of its own made to point at this machine
(DNS rebinding); its requests then carry that name in Host. So the dashboard answers only a Host
it was told: a loopback name (127.0.0.1, localhost, [::1]), the address it serves on, or a name
given with --allow-host, each with no port or the port it serves on; an --allow-host NAME:PORT
allows that pair (a tunnel's own port, say). Nothing is resolved, and other spellings of a
loopback address (127.1, 0x7f000001, [::ffff:127.0.0.1]) are not these names. A request target in
absolute form (GET http://NAME/..., as sent to a proxy) names a host as well: it must be told too.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass

from conveyor.errors import ConveyorError

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_HOST = re.compile(r"(?P<name>\[[0-9a-f:.]+\]|[a-z0-9_][a-z0-9_.-]*)(?::(?P<port>[0-9]{1,5}))?")


def host_entry(value: str) -> str:
    """An --allow-host value as a browser writes it in Host.

    An --allow-host value as a browser writes it in Host: NAME or NAME:PORT, lowercase, an IPv6
    address compressed and in brackets. Raises ConveyorError for anything else.
    """
    text = value.strip().lower()
    if text.count(":") > 1 and not text.startswith("["):
        text = f"[{text}]"  # a bare IPv6 address
    found = _HOST.fullmatch(text)
    name = None if found is None else _as_browsers_write(found["name"])
    port = None if found is None else found["port"]
    if name is None or (port is not None and not 0 < int(port) < 65536):
        raise ConveyorError(
            f"cannot allow the host {value!r:.80}: give a name as the browser's address bar shows it, without scheme "
            "or path (NAME, or NAME:PORT for a port not the dashboard's)"
        )
    return name if port is None else f"{name}:{port}"


def _as_browsers_write(name: str) -> str | None:
    """A name as browsers write it in Host (an IPv6 address compressed); None for brackets around no IPv6 address."""
    if not name.startswith("["):
        return name
    try:
        return f"[{ipaddress.IPv6Address(name[1:-1])}]"
    except ValueError:
        return None


@dataclass(frozen=True)
class Hosts:
    """The Host headers to answer: `names`, with no port or the port served on; `pairs`, as written."""

    names: frozenset[str]
    pairs: frozenset[str]

    @classmethod
    def allowing(cls, served_on: str, allowed: Iterable[str]) -> Hosts:
        """The loopback names, the address served on (when it reads as a name) and `allowed`."""
        entries = [host_entry(a) for a in allowed]
        with contextlib.suppress(ConveyorError):  # an address written some other way is no name a browser sends
            entries.append(host_entry(served_on))
        with_port = {e for e in entries if ":" in e and not e.endswith("]")}  # NAME:PORT, [IPv6]:PORT
        return cls(frozenset((*LOOPBACK_NAMES, *(set(entries) - with_port))), frozenset(with_port))

    def answers(self, host: str | None, port: int, target: str = "/") -> bool:
        """Whether to answer a request whose Host header is `host`, on `port`, for `target`.

        Whether to answer a request whose Host header is `host`, that came in on `port`, for
        `target` (its request line's): in absolute form, as sent to a proxy, that names a host too.
        """
        absolute = not target.startswith("/") and target != "*"
        return self._told(host, port) and (not absolute or self._told(urllib.parse.urlsplit(target).netloc, port))

    def _told(self, host: str | None, port: int) -> bool:
        if not host:
            return False
        host = host.lower()
        name, _, given = host.rpartition(":") if not host.endswith("]") else (host, "", "")
        return host in self.pairs or host in self.names or (given == str(port) and name in self.names)
