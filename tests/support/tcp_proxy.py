"""A TCP proxy on 127.0.0.1 that can make a server slow or black-hole it (tests of clients that must not wait).

    with TcpProxy(target_port) as proxy:      # proxy.port forwards to 127.0.0.1:target_port
        proxy.set_mode("blackhole")           # connections are accepted; nothing is forwarded either way
        proxy.set_mode("delay", 1.0)          # every chunk, each way, waits 1 s
        proxy.set_mode("pass")                # held bytes flow again (if their sockets are still open)

Bytes are held, never dropped: a black-holed request reaches the server when the proxy passes again, unless its
client gave up and closed the connection first (then the proxy closes the other side too).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class TcpProxy:
    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        self._mode: tuple[str, float] = ("pass", 0.0)
        self._changed = threading.Condition()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.connections = 0

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_mode(self, mode: str, seconds: float = 0.0) -> None:
        if mode not in ("pass", "blackhole", "delay"):
            raise ValueError(f"unknown proxy mode {mode!r}; valid: pass, blackhole, delay")
        with self._changed:
            self._mode = (mode, seconds)
            self._changed.notify_all()

    def _wait_passable(self) -> bool:
        """Block while black-holed; sleep the delay; False once closed."""
        with self._changed:
            while self._mode[0] == "blackhole" and not self._closed.is_set():
                self._changed.wait(0.1)
            mode, seconds = self._mode
        if mode == "delay" and seconds:
            time.sleep(seconds)
        return not self._closed.is_set()

    def _track(self, s: socket.socket) -> None:
        with self._lock:
            self._sockets.append(s)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data or not self._wait_passable():
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def _serve(self, client: socket.socket) -> None:
        if not self._wait_passable():  # a black-holed connection waits here, accepted but not forwarded
            client.close()
            return
        try:
            upstream = socket.create_connection(self.target, timeout=10)
            upstream.settimeout(None)
        except OSError:
            client.close()
            return
        self._track(upstream)
        threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
        threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            self._track(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def start(self) -> TcpProxy:
        threading.Thread(target=self._accept, name="tcp-proxy", daemon=True).start()
        return self

    def close(self) -> None:
        self._closed.set()
        with self._changed:
            self._changed.notify_all()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() of the accepting thread
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.close()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
