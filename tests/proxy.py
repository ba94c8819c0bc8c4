"""A TCP proxy in front of a test's `orbit server` that cuts every connection after some bytes
of the server's answers: a dropped link, a flaky network or a proxy's timeout, part way
through a stream or a transfer."""

from __future__ import annotations

import contextlib
import socket
import threading


class CuttingProxy:
    def __init__(self, upstream: str, cut_after: int) -> None:
        host, port = upstream.removeprefix("http://").rsplit(":", 1)
        self.upstream, self.cut_after = (host, int(port)), cut_after
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.cuts = 0  # connections cut so far
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            threading.Thread(target=self._pipe, args=(client, upstream, None), daemon=True).start()
            threading.Thread(
                target=self._pipe, args=(upstream, client, self.cut_after), daemon=True
            ).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, limit: int | None) -> None:
        moved = 0
        try:
            while data := src.recv(65536):
                if limit is not None and moved + len(data) > limit:
                    dst.sendall(data[: limit - moved])
                    self.cuts += 1
                    break
                dst.sendall(data)
                moved += len(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.sock.close()
