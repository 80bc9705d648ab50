"""The one way reference transports open TCP connections: listen, dial lower ranks, present the token.

Used by the c10d reference backend's mesh (transport.py) and by reference-tp
(rpc/tp_transport.py); each brings its own hello frame (its wire format) and
decides what an adopted connection becomes. Rendezvous goes through the c10d
Store the caller is given, under its ``prefix``:

* rank 0 draws a random token and publishes it (``<prefix>/token``); every
  rank publishes the address of its listening socket (port 0: the OS picks a
  free one) as ``<prefix>/addr/<rank>``;
* rank r dials every lower rank and presents (token, rank) in its hello;
* the listener accepts a connection only with the right token from a rank
  that dials it (a higher rank of the world) and that the owner agrees to
  adopt (not connected yet). Anyone else is refused, counted in ``refused``
  with the reason, and told why when the format can say it: the store is the
  membership.
"""

from __future__ import annotations

import hmac
import os
import secrets
import socket
import threading
from datetime import timedelta
from typing import Callable

from .codec import ProtocolError

HANDSHAKE_TIMEOUT_S = 10.0

# read_hello(sock) -> the hello's JSON object; raises ProtocolError for anything else
ReadHello = Callable[[socket.socket], dict]
# adopt(peer, sock): take the connection; raises ProtocolError to refuse it (e.g. already connected)
Adopt = Callable[[int, socket.socket], None]
# on_refused(sock, address, error): a last word to the refused peer before the socket is closed
OnRefused = Callable[[socket.socket, object, Exception], None]


def interface_address(name: str, variable: str) -> str:
    """The IPv4 address of network interface ``name`` (named by ``variable``), or a clear error."""
    import fcntl
    import struct

    siocgifaddr = 0x8915
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            packed = fcntl.ioctl(probe.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
    except OSError as exc:
        raise ValueError(f"{variable}={name!r}: no IPv4 address on that interface here ({exc.strerror})") from None
    return socket.inet_ntoa(packed[20:24])


def listen_host(interface_variable: str, host_variable: str | None = None) -> str:
    """Where a reference transport listens, chosen the way users choose gloo's and TensorPipe's:

    an address (``host_variable``, when the transport has one), else the address of the interface
    ``interface_variable`` names (as ``GLOO_SOCKET_IFNAME`` / ``TP_SOCKET_IFNAME``), else loopback.
    """
    host = os.environ.get(host_variable) if host_variable else None
    if host:
        return host
    interface = os.environ.get(interface_variable)
    return interface_address(interface, interface_variable) if interface else "127.0.0.1"


def _read(store, key: str, wait_s: float | None) -> bytes:
    """``key``'s value; with ``wait_s``, a key nobody publishes within it raises torch's DistStoreError then
    instead of after the store's own timeout (minutes): a rendezvous bounded by its caller's timeout."""
    if wait_s is not None:
        store.wait([key], timedelta(seconds=max(0.001, wait_s)))
    return store.get(key)


def world_token(store, prefix: str, rank: int, wait_s: float | None = None) -> bytes:
    """The world's token: drawn by rank 0, read by everyone (blocks until rank 0 published it, or ``wait_s``)."""
    if rank == 0:
        store.set(f"{prefix}/token", secrets.token_hex(16))
    return _read(store, f"{prefix}/token", wait_s)


def address_of(store, prefix: str, peer: int, wait_s: float | None = None) -> tuple[str, int]:
    """``peer``'s published listening address (blocks until the peer published it, within ``wait_s`` if given,
    else the store's timeout)."""
    peer_host, port = _read(store, f"{prefix}/addr/{peer}", wait_s).decode().rsplit(":", 1)
    return peer_host, int(port)


def dial(store, prefix: str, peer: int, hello: bytes, timeout_s: float) -> socket.socket:
    """Connect to ``peer``'s published address and present ``hello``; the socket is blocking after it."""
    return dial_address(address_of(store, prefix, peer), hello, timeout_s)


def dial_address(address: tuple[str, int], hello: bytes, timeout_s: float) -> socket.socket:
    """Connect to a peer's listening ``address`` and present ``hello``; the socket is blocking after it."""
    sock = socket.create_connection(address, timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(hello)
    sock.settimeout(None)
    return sock


class Listener:
    """A listening socket (port 0, published in the store) that adopts only the world's own dialers."""

    def __init__(self, store, prefix: str, *, host: str, rank: int, world_size: int, token: bytes,
                 read_hello: ReadHello, adopt: Adopt, on_refused: OnRefused | None = None,
                 refused: list | None = None, thread_name: str = "reference"):
        self.rank, self.world_size, self._token = rank, world_size, token
        self._read_hello, self._adopt, self._on_refused = read_hello, adopt, on_refused
        self.refused: list[str] = refused if refused is not None else []  # why each refusal happened
        self._thread_name = thread_name
        self._closed = False
        self._sock = socket.create_server((host, 0), backlog=max(16, world_size))
        self.address = self._sock.getsockname()[:2]
        store.set(f"{prefix}/addr/{rank}", f"{self.address[0]}:{self.address[1]}")
        threading.Thread(target=self._accept_loop, name=f"{thread_name}-accept-r{rank}", daemon=True).start()

    @property
    def port(self) -> int:
        return self.address[1]

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                sock, address = self._sock.accept()
            except OSError:
                return  # listener closed
            threading.Thread(target=self._handshake, args=(sock, address), daemon=True,
                             name=f"{self._thread_name}-handshake-r{self.rank}").start()

    def _handshake(self, sock: socket.socket, address) -> None:
        try:
            sock.settimeout(HANDSHAKE_TIMEOUT_S)
            hello = self._read_hello(sock)
            token, peer = hello.get("token"), hello.get("rank")
            if not isinstance(token, str) or not hmac.compare_digest(token.encode(), self._token):
                raise ProtocolError("wrong world token")
            if not isinstance(peer, int) or isinstance(peer, bool) or not self.rank < peer < self.world_size:
                raise ProtocolError(f"rank {peer!r} is not a rank that dials rank {self.rank} "
                                    f"(world size {self.world_size})")
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._adopt(peer, sock)
        except (ProtocolError, OSError, EOFError) as exc:
            self.refused.append(f"{address}: {exc}")
            if self._on_refused is not None:
                self._on_refused(sock, address, exc)
            try:
                sock.close()
            except OSError:
                pass

    def close(self) -> None:
        self._closed = True
        try:  # wakes the accept loop; close() alone leaves it blocked and the port listening
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass
