"""A small TCP proxy the fault tests own: it forwards loopback connections to a
target port and can blackhole them, as a silent network partition would.

    p = TcpProxy(services.amqp_port).start()
    url = "amqp://guest:guest@127.0.0.1:%d/..." % p.port
    p.blackhole(True)    # bytes in both directions are read and dropped; the
                         # sockets stay open, so neither side sees a reset or EOF
    p.blackhole(False)   # forwarding resumes (what was dropped stays lost)
    p.freeze(True)       # the path stops at the next chunk read from either side:
                         # that chunk is held, never delivered, and neither side
                         # is read any more, so each sender's writes stall once
                         # the kernel buffers are full; p.frozen() says it is cut
    p.freeze(False)      # reading and forwarding resume (the held chunk is dropped)
    p.reset_all()        # every proxied connection is closed (RST) at once
    p.close()

listen_port picks the port it listens on (default: a free one), for a test
whose client was told the port before anything listened there.

A blackhole still reads, so a sender never stalls; a freeze is the harder case,
as a route that stops forwarding is: the receiver's window closes and each side's
writes pile up in its own send buffer. While blackholed or frozen, new
connections are accepted and then held silent as well, as a partition would
leave a SYN unanswered only at the TCP level (the client's own connect timeout
is what such a test exercises).
"""
import select
import socket
import struct
import threading


class TcpProxy:
    def __init__(self, target_port, target_host="127.0.0.1", listen_port=0):
        self.target = (target_host, target_port)
        self._lsock = socket.socket()
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind(("127.0.0.1", listen_port))
        self._lsock.listen(512)
        self.port = self._lsock.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs = {}          # socket -> its peer socket
        self._holed = False
        self._cut = None          # None, "armed" (at the next chunk) or "frozen"
        self.held = []            # (socket, chunk) read at the cut, never forwarded
        self._stop = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.accepted = 0
        self.dropped_bytes = 0

    def start(self):
        self._thread.start()
        return self

    def _wake(self):
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def blackhole(self, on=True):
        with self._lock:
            self._holed = bool(on)
        self._wake()

    def freeze(self, on=True):
        with self._lock:
            self._cut = "armed" if on else None
            if not on:
                self.held = []
        self._wake()

    def frozen(self):
        with self._lock:
            return self._cut == "frozen"

    def connections(self):
        with self._lock:
            return len(self._pairs) // 2

    def reset_all(self):
        with self._lock:
            socks = list(self._pairs)
            self._pairs.clear()
        for s in socks:
            try:
                # SO_LINGER 0: close() sends a reset, as a dying peer would.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
            s.close()
        self._wake()

    def close(self):
        self._stop = True
        self._wake()
        self._thread.join(timeout=5)
        self.reset_all()
        self._lsock.close()
        self._wake_r.close()
        self._wake_w.close()

    def _accept(self):
        try:
            c, _ = self._lsock.accept()
        except OSError:
            return
        try:
            u = socket.create_connection(self.target, timeout=5)
        except OSError:
            c.close()
            return
        u.settimeout(None)
        for s in (c, u):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._pairs[c] = u
            self._pairs[u] = c
            self.accepted += 1

    def _drop(self, s):
        with self._lock:
            peer = self._pairs.pop(s, None)
            if peer is not None:
                self._pairs.pop(peer, None)
        for x in (s, peer):
            if x is not None:
                try:
                    x.close()
                except OSError:
                    pass

    def _run(self):
        while not self._stop:
            with self._lock:
                socks = [] if self._cut == "frozen" else list(self._pairs)
            try:
                r, _, _ = select.select([self._lsock, self._wake_r] + socks, [], [], 0.5)
            except (OSError, ValueError):
                continue
            for s in r:
                if s is self._wake_r:
                    try:
                        self._wake_r.recv(4096)
                    except OSError:
                        pass
                    continue
                if s is self._lsock:
                    self._accept()
                    continue
                try:
                    data = s.recv(65536)
                except OSError:
                    data = b""
                with self._lock:
                    peer = self._pairs.get(s)
                    holed = self._holed
                    cut = self._cut
                    if cut == "armed" and data:
                        # The cut falls between this read and its write.
                        self._cut = cut = "frozen"
                        self.held.append((s, data))
                        continue
                if cut == "frozen":
                    # Read in the turn of the cut: held as well (an end of
                    # stream too: the other side must not hear of it).
                    if data:
                        self.held.append((s, data))
                    continue
                if not data and holed:
                    # A partition hides a close too: this side goes, its peer
                    # stays open and hears nothing (until forwarding resumes
                    # and a write to the closed side drops it).
                    with self._lock:
                        self._pairs.pop(s, None)
                    s.close()
                    continue
                if not data:
                    self._drop(s)
                    continue
                if holed:
                    self.dropped_bytes += len(data)
                    continue
                if peer is None:
                    continue
                try:
                    peer.sendall(data)
                except OSError:
                    self._drop(s)
