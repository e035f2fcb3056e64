"""The server process's surroundings: event loop, descriptor limit, data directory, parent process.

The server process's surroundings: its event loop (uvloop where installed) and how a listener closes
on it, its descriptor limit, its data directory, and noticing that the process that started it is
gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import logging
import os
import resource
import socket
import stat
import struct
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from conveyor.constants import PARENT_CHECK_S
from conveyor.errors import ConveyorError

log = logging.getLogger("conveyor.server.queue_server")

FD_LIMIT_CAP = 1 << 20
SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's address
IPV6_SCOPE_GLOBAL, IPV6_SCOPE_HOST = "00", "10"  # scopes in /proc/net/if_inet6 (link-local is "20")
ACCEPT_TURNS = 4  # turns of the loop from a socket accepted to its handler running (asyncio: accept, transport, protocol, task)


async def watch_parent(loop: asyncio.AbstractEventLoop, stop: Callable[[], None]) -> None:
    """Call `stop` once the parent process is gone: stdin (a pipe from it) ends, or we are re-parented.

    The pipe alone is not enough: a child the parent forked may hold its end open. A terminal or
    /dev/null as stdin is never read (a background read of a terminal would suspend the server).
    """
    parent = os.getppid()
    ended = asyncio.Event()
    try:
        fd = sys.stdin.fileno()
        mode = os.fstat(fd).st_mode
    except (AttributeError, OSError, ValueError):  # no stdin at all
        fd, mode = -1, 0
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):

        def readable() -> None:
            try:
                more = os.read(fd, 4096)
            except OSError:
                more = b""
            if not more:
                loop.remove_reader(fd)
                ended.set()

        loop.add_reader(fd, readable)
    while not ended.is_set() and os.getppid() == parent:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ended.wait(), PARENT_CHECK_S)
    log.warning("the process that started this server is gone: stopping")
    stop()


def raise_fd_limit() -> int:
    """Raise this process's descriptor limit as far as the OS lets it; returns the limit now.

    Raise this process's descriptor limit as far as the OS lets it (a server holds a few per queue
    and one per connection); returns the limit now.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FD_LIMIT_CAP if hard == resource.RLIM_INFINITY else min(hard, FD_LIMIT_CAP)
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return FD_LIMIT_CAP if soft == resource.RLIM_INFINITY else soft


def check_data_dir(path: Path) -> None:
    """Make the data directory `path` if missing and make sure this process can create files in it.

    Make the data directory `path` if it is missing and make sure this process can create files in
    it; else a ConveyorError saying what is wrong with it and what to do (the OSError a server would
    meet later names a file, not the remedy).
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConveyorError(
            f"the data directory {path} is a file, not a directory: give another path (a directory, "
            "made if missing) or move the file away"
        ) from None
    except NotADirectoryError:
        blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), path.parent)
        raise ConveyorError(
            f"the data directory {path} cannot be made: {blocker} is a file, not a directory: give a path under a directory"
        ) from None
    except OSError as e:
        raise ConveyorError(
            f"the data directory {path} cannot be made ({e.strerror}): make it, or give a path this "
            f"user (uid {os.geteuid()}) may create"
        ) from None
    probe = path / f".conveyor-write-test-{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
    except OSError as e:
        raise ConveyorError(
            f"the data directory {path} is not writable by this user (uid {os.geteuid()}): "
            f"{e.strerror}: give a directory it may write to, or change the directory's owner or "
            "permissions (chown, chmod)"
        ) from None


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run on uvloop where it is installed (about a third less CPU per request), else asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


def stop_accepting(listener: asyncio.base_events.Server) -> None:
    """Accept no more connections, without closing the listener yet (see `close_listener`); uvloop's accepts until then."""
    loop = asyncio.get_running_loop()
    for sock in listener.sockets:
        loop.remove_reader(sock.fileno())


async def close_listener(listener: asyncio.base_events.Server) -> None:
    """Close the listening sockets, leaving no connection they accepted unhandled once the loop stops.

    A socket accepted takes a few turns of the loop to reach its handler (which must close it while
    the server stops): so the turns before the close (asyncio's Server.close() would leave one
    accepted, not yet given its transport, unclosed) and after it (uvloop accepts until then).
    """
    for _ in range(ACCEPT_TURNS):
        await asyncio.sleep(0)
    listener.close()
    for _ in range(ACCEPT_TURNS):
        await asyncio.sleep(0)


def _ipv4(name: str) -> str | None:
    """The IPv4 address of network interface `name` (None: it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:  # SIOCGIFADDR: the interface's address
            got = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(got[20:24])


def interface_address(name: str) -> str:
    """The IPv4 address of network interface `name`; ConveyorError naming the interfaces there are, if none."""
    found = _ipv4(name)
    if found is None:
        have = {n: a for _, n in socket.if_nameindex() if (a := _ipv4(n))}
        raise ConveyorError(
            f"network interface {name!r} has no IPv4 address here; these do: "
            f"{', '.join(f'{n} ({a})' for n, a in have.items()) or 'none'}"
        )
    return found


def _routed() -> str | None:
    """This host's address on its default route (None: it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("198.51.100.1", 9))  # no packet is sent: only the route is looked up
            return str(s.getsockname()[0])
        except OSError:
            return None


def _ipv6_addresses(table: str = "/proc/net/if_inet6") -> list[str]:
    """This host's IPv6 addresses a client can use: global ones, then loopback.

    This host's IPv6 addresses a client can use: global ones, then loopback; not link-local ones,
    which need an interface to be named (Linux's table; elsewhere none).
    """
    try:
        with open(table) as f:
            rows = [line.split() for line in f]
    except OSError:
        return []
    found = [
        (row[3] == IPV6_SCOPE_HOST, ipaddress.IPv6Address(bytes.fromhex(row[0])))
        for row in rows
        if len(row) >= 4 and row[3] in (IPV6_SCOPE_GLOBAL, IPV6_SCOPE_HOST)
    ]
    return [str(a) for _, a in sorted(found)]


def reachable_addresses(address: str, host: str, port: int, ipv6_table: str = "/proc/net/if_inet6") -> list[str]:
    """Addresses a client can use for a server at `address`.

    Addresses a client can use for a server at `address`: bound to every interface (0.0.0.0 or ::),
    one per interface address, loopback last (0.0.0.0 itself reaches nothing from elsewhere). `::`
    binds IPv6 only (asyncio sets IPV6_V6ONLY), so it lists IPv6 addresses; 0.0.0.0, IPv4 ones.
    """
    if host not in ("0.0.0.0", "::", ""):
        return [address]
    scheme = address.split("://")[0]
    if host == "::":
        return [f"{scheme}://[{a}]:{port}" for a in _ipv6_addresses(ipv6_table)] or [address]
    found = {a for _, name in socket.if_nameindex() if (a := _ipv4(name))}
    routed = _routed()  # the address of the default route's interface first (not docker0's, say)
    ordered = sorted(found, key=lambda a: (a != routed, ipaddress.ip_address(a).is_loopback, a))
    return [f"{scheme}://{a}:{port}" for a in ordered] or [address]
