"""A lost parent seen at once: a TCP connection between rank 0's parent and every other parent.

A process that ends, however it ends (SIGKILL, the OOM killer, a node shutting down), has its sockets closed by the
kernel, and the other end reads EOF at once: seconds before the parent's heartbeat on the board is judged still
(:meth:`~lightning_scale.restart.board.AttemptBoard.silent_peers`). A host that vanishes without closing them (power
loss, a network partition) is still found by the heartbeat.

Rank 0's parent listens and accepts one connection from every other parent; each other parent watches its one
connection to rank 0's. Rank 0's parent says on the board which parents it lost, so that every parent learns it.
No data flows: a link only ever ends.
"""

from __future__ import annotations

import select
import socket
import struct

__all__ = ["ParentLinks"]

_RANK = struct.Struct("!i")


class ParentLinks:
    """This parent's ends of the links (see the module's description).

    Args:
        rank: This parent's rank.
        world_size: Parents of the job.
        host: The address rank 0's parent listens on (``MASTER_ADDR``).

    Examples:
        >>> zero = ParentLinks(0, 2, "127.0.0.1")
        >>> one = ParentLinks(1, 2, "127.0.0.1")
        >>> one.connect(zero.port)
        >>> zero.lost(), one.lost()
        ([], [])
        >>> one.close()
        >>> zero.lost()
        [1]
        >>> zero.close()
    """

    def __init__(self, rank: int, world_size: int, host: str) -> None:
        self.rank = rank
        self.world_size = world_size
        self.host = "127.0.0.1" if host == "localhost" else host
        self._listener: socket.socket | None = None
        self._peers: dict[int, socket.socket] = {}  # rank -> its open link
        self._lost: set[int] = set()
        if rank == 0 and world_size > 1:
            self._listener = socket.create_server((self.host, 0), backlog=world_size)
            self._listener.setblocking(False)

    @property
    def port(self) -> int:
        """The port rank 0's parent listens on (rank 0 only)."""
        assert self._listener is not None, "only rank 0's parent listens"
        return int(self._listener.getsockname()[1])

    def connect(self, port: int) -> None:
        """Open this parent's link to rank 0's (ranks other than 0)."""
        link = socket.create_connection((self.host, port), timeout=30)
        link.sendall(_RANK.pack(self.rank))
        self._peers[0] = link

    def lost(self) -> list[int]:
        """The ranks whose parent this one has lost a link to, so far (never blocks)."""
        self._accept()
        if self._peers:
            readable, _, _ = select.select(list(self._peers.values()), [], [], 0)
            for rank, link in list(self._peers.items()):
                if link in readable and _ended(link):
                    self._lost.add(rank)
                    link.close()
                    del self._peers[rank]
        return sorted(self._lost)

    def _accept(self) -> None:
        """Take the connections that other parents opened (rank 0)."""
        while self._listener is not None:
            try:
                link, _ = self._listener.accept()
            except BlockingIOError:
                return
            link.settimeout(5)
            try:
                (rank,) = _RANK.unpack(link.recv(_RANK.size, socket.MSG_WAITALL))
            except (OSError, struct.error):
                link.close()  # a parent that died as it connected: its heartbeat tells
                continue
            self._peers[rank] = link

    def close(self) -> None:
        """Close every link and the listener; safe to call twice."""
        for link in self._peers.values():
            link.close()
        self._peers.clear()
        if self._listener is not None:
            self._listener.close()
            self._listener = None


def _ended(link: socket.socket) -> bool:
    """Whether a link that ``select`` found readable has ended (no data is ever sent on it: EOF or an error)."""
    try:
        return link.recv(1, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
