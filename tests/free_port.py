#!/usr/bin/python3
"""Prints a port on 127.0.0.1 that binds now, drawn from 10000-19999: below the kernel's
ephemeral range (32768-), so that another process's outgoing connection cannot take it before
the daemon binds it (a port the kernel picked with bind(0) could be), and below the agents'
ports (20000-). For the shell checks; the Python tests use conftest.free_port, the same rule."""
import random
import socket
import sys

for _ in range(200):
    p = random.randrange(10000, 20000)
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
        print(p)
        sys.exit(0)
    except OSError:
        pass
sys.exit("no free port in 10000-19999")
