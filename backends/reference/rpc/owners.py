"""The owner table: this worker's owned values and the fork bookkeeping of every RRef (rref.py explains the rule).

One ``OwnerTable`` per agent (``agent.rrefs``). It changes RRef objects
only through their own methods (``RRef._make``, ``RRef._adopt``); the agent
hands it the RRef messages (fork requests, user deletes) in delivery order.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading

import torch

from .failures import Failure, raise_remote
from .rref import RRef, confirm_with_owner
from .transport import Kind

log = logging.getLogger(__name__)

K_USER_DELETE, K_FORK_REQUEST = int(Kind.RREF_USER_DELETE), int(Kind.RREF_FORK_REQUEST)


class OwnerEntry:
    __slots__ = ("value", "users", "tombstones", "created", "awaited")

    def __init__(self):
        self.value = torch.futures.Future()
        self.users: set = set()
        self.tombstones: set = set()
        self.created = False
        self.awaited: dict = {}  # fork id -> futures of users waiting for its registration


_decoding = threading.local()  # .forks: unconfirmed user RRefs made while one message is decoded


class OwnerTable:
    """This worker's owned values and the fork bookkeeping of every RRef (see rref.py)."""

    def __init__(self, agent):
        self.agent = agent
        self.lock = threading.Lock()
        self.owned: dict[tuple, OwnerEntry] = {}
        self.released: queue.SimpleQueue = queue.SimpleQueue()  # (owner, rref_id, fork_id) from __del__
        self._ids = itertools.count(1)

    def new_id(self) -> tuple:
        return (self.agent.rank, next(self._ids))

    def _entry(self, rref_id) -> OwnerEntry:
        entry = self.owned.get(rref_id)
        if entry is None:
            entry = self.owned[rref_id] = OwnerEntry()
        return entry

    def entry(self, rref_id) -> OwnerEntry:
        """The entry of ``rref_id``, made (empty, value pending) if this is the first word of it."""
        with self.lock:
            return self._entry(rref_id)

    def find(self, rref_id) -> OwnerEntry | None:
        with self.lock:
            return self.owned.get(rref_id)

    def clear(self) -> None:
        """The agent stopped: forget every owned value."""
        with self.lock:
            self.owned.clear()

    # ------------------------------------------------ owner-side changes
    def _maybe_free(self, rref_id, entry: OwnerEntry) -> None:
        """Drop a value no fork refers to any more (under the lock)."""
        if entry.created and not entry.users and not entry.tombstones and self.owned.get(rref_id) is entry:
            del self.owned[rref_id]

    def add_fork(self, rref_id, fork_id) -> OwnerEntry:
        with self.lock:
            entry = self._entry(rref_id)
            if fork_id in entry.tombstones:  # its delete came first: the two cancel out
                entry.tombstones.discard(fork_id)
                self._maybe_free(rref_id, entry)
            else:
                entry.users.add(fork_id)
            waiting = entry.awaited.pop(fork_id, ())
        for fut in waiting:
            fut.set_result(True)
        return entry

    def fork_registered(self, rref_id, fork_id) -> torch.futures.Future:
        """On the owner: completes once ``fork_id`` is registered (its parent's fork request arrived)."""
        fut = torch.futures.Future()
        with self.lock:
            entry = self._entry(rref_id)
            if fork_id not in entry.users:
                entry.awaited.setdefault(fork_id, []).append(fut)
                return fut
        fut.set_result(True)
        return fut

    # ------------------------------------------------ a user confirms the forks it received
    @staticmethod
    def decoding():
        """Around decoding one request: collects the unconfirmed user RRefs it makes (see ``confirm``)."""
        return _CollectForks()

    def confirm(self, forks: list) -> torch.futures.Future:
        """Ask each owner to confirm these forks (torch's fork ACK); completes when every one is confirmed.

        torch runs a function that received user RRefs only once their owners
        acknowledged the forks, so ``confirmed_by_owner()`` is True inside it.
        """
        confirmations = [confirm_with_owner(rref) for rref in forks]
        return torch.futures.collect_all(confirmations)

    def delete_fork(self, rref_id, fork_id) -> None:
        with self.lock:
            entry = self._entry(rref_id)
            if fork_id in entry.users:
                entry.users.discard(fork_id)
                self._maybe_free(rref_id, entry)
            else:
                entry.tombstones.add(fork_id)

    def created(self, rref_id) -> OwnerEntry:
        """The value's creation ran (remote() or RRef(value)); the caller sets it on the returned entry."""
        with self.lock:
            entry = self._entry(rref_id)
            entry.created = True
            self._maybe_free(rref_id, entry)  # every fork may be gone already
            return entry

    def owned_count(self) -> int:
        with self.lock:
            return len(self.owned)

    def handle(self, kind: int, rref_id, fork_id) -> bool:
        """An RRef message from a peer (delivery order); False if ``kind`` is not one."""
        if kind == K_FORK_REQUEST:
            self.add_fork(rref_id, fork_id)
        elif kind == K_USER_DELETE:
            self.delete_fork(rref_id, fork_id)
        else:
            return False
        return True

    # ------------------------------------------------ RRef objects
    def adopt_local(self, rref: RRef, value) -> None:
        """``RRef(value)``: an owner RRef to a local value."""
        rref_id = self.new_id()
        fork_id = self.new_id()
        rref._adopt(self.agent, rref_id, fork_id)
        entry = self.add_fork(rref_id, fork_id)
        self.created(rref_id)
        entry.value.set_result(value)

    def fork(self, rref_id, owner: int, is_owner: bool, confirmed: bool) -> tuple:
        """A new fork of an RRef for a message being pickled; registered before the message goes."""
        child = self.new_id()
        if is_owner:
            self.add_fork(rref_id, child)
        else:
            self.agent.send_control(owner, K_FORK_REQUEST, (rref_id, child))
        return (rref_id, child, owner, confirmed)

    def new_user(self, owner: int) -> RRef:
        """The caller's RRef to the value a remote() is about to create on ``owner`` (unconfirmed)."""
        return RRef._make(self.agent, self.new_id(), self.new_id(), owner, confirmed=False)

    def from_fork(self, rref_id, fork_id, owner, confirmed) -> RRef:
        rref = RRef._make(self.agent, rref_id, fork_id, owner, confirmed or owner == self.agent.rank)
        forks = getattr(_decoding, "forks", None)
        if forks is not None and not rref.confirmed_by_owner():
            forks.append(rref)
        return rref

    def release(self, owner: int, rref_id, fork_id) -> None:
        """An RRef object is gone (called from __del__: only queue, never send here)."""
        if self.agent.stopped:
            return
        self.released.put((owner, rref_id, fork_id))

    def flush_released(self) -> None:
        while True:
            try:
                owner, rref_id, fork_id = self.released.get_nowait()
            except queue.Empty:
                return
            if owner == self.agent.rank:
                self.delete_fork(rref_id, fork_id)
            else:
                try:
                    self.agent.send_control(owner, K_USER_DELETE, (rref_id, fork_id))
                except Exception as exc:  # the owner is gone: nothing left to free there
                    log.debug("RRef delete to rank %s not sent: %s", owner, exc)

    def local_value(self, rref_id):
        with self.lock:
            entry = self.owned.get(rref_id)
        if entry is None:
            raise RuntimeError(f"RRef {rref_id} has no value on its owner {self.agent.info}")
        try:
            return entry.value.wait()
        except Failure as exc:  # remote() failed: the owner raises the creation's error, as torch's OwnerRRef
            raise raise_remote(*exc.failure) from None


class _CollectForks:
    """``with OwnerTable.decoding() as forks``: the unconfirmed user RRefs made in this thread meanwhile."""

    def __enter__(self) -> list:
        self._outer = getattr(_decoding, "forks", None)
        _decoding.forks = []
        return _decoding.forks

    def __exit__(self, *exc) -> None:
        _decoding.forks = self._outer
