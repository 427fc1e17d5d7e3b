"""One plain TCP stream: the most one connection moves between two hosts.

    python3 bench/tcp_stream.py --serve HOST:PORT --bytes N     # the receiver
    python3 bench/tcp_stream.py --send HOST:PORT --bytes N      # prints one JSON line

The sender writes N bytes in 4 MiB sendall calls; the receiver reads them
with recv_into and answers one byte; the sender's time runs from before its
first byte to that answer. Default socket options (what a plain stream
gets); no payload copies beyond the kernel's.
"""
import argparse
import json
import socket
import time

CHUNK = 4 << 20


def address(s):
    host, port = s.rsplit(":", 1)
    return host, int(port)


def serve(addr, total):
    with socket.create_server(addr) as server:
        conn, _ = server.accept()
        with conn:
            buf = bytearray(CHUNK)
            view = memoryview(buf)
            got = 0
            while got < total:
                n = conn.recv_into(view, min(CHUNK, total - got))
                if n == 0:
                    raise SystemExit(f"the sender closed after {got} of {total} bytes")
                got += n
            conn.sendall(b"k")


def send(addr, total, timeout):
    payload = memoryview(bytes(CHUNK))
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = socket.create_connection(addr, timeout=timeout)
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with conn:
        start = time.perf_counter()
        sent = 0
        while sent < total:
            n = min(CHUNK, total - sent)
            conn.sendall(payload[:n])
            sent += n
        if conn.recv(1) != b"k":
            raise SystemExit("no answer from the receiver")
        secs = time.perf_counter() - start
    print(json.dumps({"bytes": total, "seconds": secs, "gbps": total / secs / 1e9}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--serve")
    p.add_argument("--send")
    p.add_argument("--bytes", type=int, default=1 << 30)
    p.add_argument("--timeout", type=float, default=60)
    a = p.parse_args()
    if a.serve:
        serve(address(a.serve), a.bytes)
    elif a.send:
        send(address(a.send), a.bytes, a.timeout)
    else:
        p.error("--serve or --send")


if __name__ == "__main__":
    main()
