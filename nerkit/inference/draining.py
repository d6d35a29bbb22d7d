"""The HTTP protocol and worker supervisor of `nerkit serve`: uvicorn's, with a shutdown that loses no
request sent on a kept-alive connection.

uvicorn stops by closing every idle connection at once and (with h11) answers the requests in flight
without `Connection: close`. A keep-alive client (httpx, requests.Session, an nginx upstream) then
sends its next request on a connection that is being closed and gets EOF or a reset: the request is
lost, and the client cannot tell whether it was served. Here, once the server stops, every response
says `Connection: close`, and an idle connection stays open `LINGER` seconds more, so that a request
already on its way is answered too. The client's next request goes on a new connection, which is
refused before anything is written, so the client knows it was not served.

With `--workers`, every process holds the one listening socket, and the kernel takes connections
for it while any of them has it open: a client told to close by a worker that stopped first would
reconnect to one still to stop, and could be reset with its request when that one lets the socket
go. So the supervisor stops the socket listening in every process at once before it signals them.
"""

from __future__ import annotations

import asyncio
import errno
import socket

from uvicorn.protocols.http.auto import AutoHTTPProtocol
from uvicorn.supervisors import Multiprocess

CLOSE = (b"connection", b"close")

# Seconds an idle connection stays open once the server stops, for a request that crossed the stop.
# A client that sends within them is answered; one that sends later finds the connection closed
# before it writes (as after uvicorn's keep-alive timeout). A shutdown with idle connections takes them.
LINGER = 1.0


class DrainingHTTPProtocol(AutoHTTPProtocol):  # uvicorn's httptools protocol if installed, else h11's
    """One connection; `shutdown` is uvicorn's call when the server stops, once it no longer listens."""

    def shutdown(self) -> None:
        state = self.server_state
        if CLOSE not in state.default_headers:  # every response from now on; uvicorn no longer renews them
            state.default_headers = [*state.default_headers, CLOSE]
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.default_headers = state.default_headers  # read when its response starts
            self.cycle.keep_alive = False
        else:
            self.loop.call_later(LINGER, self._close_if_idle)

    def _close_if_idle(self) -> None:
        if not self.transport.is_closing():  # else a request came and its answer closed the connection
            super().shutdown()  # closes an idle connection; one serving a request closes after it


class DrainingSupervisor(Multiprocess):
    """uvicorn's supervisor of `--workers` processes, which lets the listening socket go when told to
    stop: the workers close theirs as they stop, and a listener still open in this process would take
    connections that nobody accepts, and reset them, requests and all, when it ends."""

    def handle_int(self) -> None:
        self._stop_listening()
        super().handle_int()

    def handle_term(self) -> None:
        self._stop_listening()
        super().handle_term()

    def _stop_listening(self) -> None:
        for sock in self.sockets:
            try:
                sock.shutdown(socket.SHUT_RD)  # Linux: it listens no more, in every process that holds it
            except OSError:  # elsewhere (macOS: ENOTCONN) each process's close ends it
                pass
            sock.close()


def quiet_once_unlistened(loop: asyncio.AbstractEventLoop) -> None:
    """In a worker process: once the supervisor has stopped the shared socket listening, asyncio
    finds it readable and its accept fails with EINVAL on every turn of the loop until the worker's
    own stop (the supervisor's signal, a tenth of a second at most) closes it. Those errors are the
    stop, not a fault: left out of the log, every other one logged as before."""
    def handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        error = context.get("exception")
        if not (isinstance(error, OSError) and error.errno == errno.EINVAL
                and "_accept_connection" in context.get("message", "")):
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
