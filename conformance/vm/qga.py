#!/usr/bin/env python3
"""The test's way into the virtual-machine node: the QEMU guest agent over virtio-serial.

    qga.py SOCKET ping [--wait SECONDS]     exit 0 once the agent answers (within SECONDS)
    qga.py SOCKET exec [--timeout S] [--stdin FILE] -- CMD ARG...
                                           runs CMD in the guest; its stdout and stderr are
                                           written here, its exit code is ours
    qga.py SOCKET time                     the guest's clock (seconds since the epoch)

No network is involved, so it works before the guest's network is up and across reboots (the
agent restarts with the guest; each call synchronises first with guest-sync-delimited, which
discards whatever an earlier agent left in the channel). The agent serves one client at a time:
calls are serialised with a lock file next to the socket.
"""

import base64
import fcntl
import json
import os
import random
import socket
import sys
import time


class AgentGone(Exception):
    """The agent did not answer in time (the guest is down, booting or rebooting)."""


class Agent:
    def __init__(self, path, timeout):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
        except OSError as e:
            raise AgentGone(f"cannot connect to {path}: {e}") from e
        self.buf = b""

    def close(self):
        self.sock.close()

    def _read_json(self):
        while True:
            line, sep, rest = self.buf.partition(b"\n")
            if sep:
                self.buf = rest
                line = line.strip(b"\xff \r\t")
                if line:
                    return json.loads(line)
                continue
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout as e:
                raise AgentGone("no answer from the guest agent") from e
            if not chunk:
                raise AgentGone("the guest agent's channel closed")
            self.buf += chunk

    def sync(self):
        # A 0xff byte, then the answer carrying our id; answers to earlier requests are skipped.
        token = random.randrange(1, 2**31)
        self.sock.sendall(b"\xff" + json.dumps({"execute": "guest-sync-delimited", "arguments": {"id": token}}).encode())
        while True:
            r = self._read_json()
            if r.get("return") == token:
                return

    def call(self, cmd, **args):
        msg = {"execute": cmd}
        if args:
            msg["arguments"] = args
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        r = self._read_json()
        if "error" in r:
            raise RuntimeError(f"{cmd}: {r['error'].get('desc', r['error'])}")
        return r.get("return")


def locked(path):
    f = open(path + ".lock", "w")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def connect(path, timeout):
    a = Agent(path, timeout)
    try:
        a.sync()
    except Exception:
        a.close()
        raise
    return a


def cmd_ping(path, wait):
    deadline = time.monotonic() + wait
    while True:
        try:
            with locked(path):
                a = connect(path, 3)
                a.call("guest-ping")
                a.close()
            return 0
        except (AgentGone, OSError, ValueError):
            if time.monotonic() >= deadline:
                print(f"qga: the guest agent did not answer within {wait} s", file=sys.stderr)
                return 1
            time.sleep(1)


def cmd_exec(path, timeout, stdin, argv):
    with locked(path):
        a = connect(path, 10)
        args = {"path": argv[0], "arg": argv[1:], "capture-output": True}
        if stdin is not None:
            args["input-data"] = base64.b64encode(stdin).decode()
        pid = a.call("guest-exec", **args)["pid"]
        deadline = time.monotonic() + timeout
        while True:
            st = a.call("guest-exec-status", pid=pid)
            if st.get("exited"):
                break
            if time.monotonic() >= deadline:
                print(f"qga: {' '.join(argv)} still running after {timeout} s", file=sys.stderr)
                return 124
            time.sleep(0.2)
        a.close()
    sys.stdout.buffer.write(base64.b64decode(st.get("out-data", "")))
    sys.stdout.flush()
    sys.stderr.buffer.write(base64.b64decode(st.get("err-data", "")))
    if st.get("out-truncated") or st.get("err-truncated"):
        print("qga: the guest agent truncated the output", file=sys.stderr)
        return 125
    if "signal" in st:
        return 128 + st["signal"]
    return st.get("exitcode", 0)


def cmd_time(path):
    with locked(path):
        a = connect(path, 10)
        ns = a.call("guest-get-time")
        a.close()
    print(f"{ns / 1e9:.3f}")
    return 0


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    path, cmd, rest = argv[1], argv[2], argv[3:]
    try:
        if cmd == "ping":
            wait = float(rest[1]) if rest[:1] == ["--wait"] else 0
            return cmd_ping(path, wait)
        if cmd == "exec":
            timeout, stdin = 120.0, None
            while rest and rest[0] != "--":
                if rest[0] == "--timeout":
                    timeout = float(rest[1])
                elif rest[0] == "--stdin":
                    with open(rest[1], "rb") as f:
                        stdin = f.read()
                else:
                    print(f"qga: unknown option {rest[0]}", file=sys.stderr)
                    return 2
                rest = rest[2:]
            if not rest[1:]:
                print("qga: exec needs -- CMD", file=sys.stderr)
                return 2
            return cmd_exec(path, timeout, stdin, rest[1:])
        if cmd == "time":
            return cmd_time(path)
    except AgentGone as e:
        print(f"qga: {e}", file=sys.stderr)
        return 3
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
