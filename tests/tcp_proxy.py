"""A TCP forwarder on 127.0.0.1 that can take the network down (every connection dropped, new ones refused) or make
it go silent (connections stay open, nothing gets through)."""

from __future__ import annotations

import socket
import threading


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``127.0.0.1:target_port`` until :meth:`cut`, and again after :meth:`restore`.

    While cut, open connections are reset and new ones closed at once, as clients of a stopped server see it.
    :meth:`cut_after` cuts automatically once that many more bytes went from clients to the server (mid-upload).
    While :meth:`stall`-ed, connections stay open and new ones are accepted, but no byte is forwarded either way until
    :meth:`restore` (:meth:`stall_after`: once that many more bytes went up): a black-holed network, which only a
    client's own deadline gets out of.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.up = True
        self.bytes_up = 0
        self._cut_at: int | None = None
        self._stall_at: int | None = None
        self._flowing = threading.Event()
        self._flowing.set()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def cut(self) -> None:
        with self._lock:
            self.up, self._cut_at = False, None
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            _close(sock)

    def restore(self) -> None:
        with self._lock:
            self.up = True
        self._flowing.set()

    def stall(self) -> None:
        self._flowing.clear()

    def stall_after(self, more_bytes: int) -> None:
        with self._lock:
            self._stall_at = self.bytes_up + more_bytes

    def cut_after(self, more_bytes: int) -> None:
        with self._lock:
            self._cut_at = self.bytes_up + more_bytes

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
        self.cut()
        self._thread.join(timeout=5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self.up:
                _close(client)
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._sockets |= {client, server}
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, upstream: bool) -> None:
        try:
            while data := source.recv(65536):
                if upstream:
                    with self._lock:
                        self.bytes_up += len(data)
                        cut = self._cut_at is not None and self.bytes_up >= self._cut_at
                        if self._stall_at is not None and self.bytes_up >= self._stall_at:
                            self._stall_at = None
                            self._flowing.clear()
                    if cut:
                        self.cut()
                        return
                self._flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset, not FIN
        sock.close()
    except OSError:
        pass
