"""The status page at / on the ops port, in headless Chromium (Debian's chromium): the page's
script fetches /status.json and renders the running daemon's real values — its epoch, its
pool with a live lease, its peer — and the screenshot is a rendered page, not a blank one.
/status.json itself holds counts and sizes only, nothing of any tenant."""
import json
import os
import shutil
import struct
import subprocess
import zlib

import pytest

from conftest import h2c_channel, register, req
from moongate.v1 import pool_pb2, pool_pb2_grpc, transfer_pb2, transfer_pb2_grpc

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium package")


def chromium(*args, timeout=60):
    p = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                        "--no-first-run", "--disable-dev-shm-usage",
                        "--virtual-time-budget=5000"] + list(args),
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def png_pixels(path):
    """(width, height, raw scanlines) of an 8-bit PNG."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", chunk[:8])
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + n
    return width, height, zlib.decompress(idat)


def test_status_page_renders_the_daemons_values(make_daemon, tmp_path):
    b = make_daemon()
    d = make_daemon("--pool-bytes", "8M", "--peer-tls=false")
    seg = register(d, "src", 4096)
    dst = register(b, "dst", 4096, remote=True)
    with h2c_channel(d) as ch:
        lease = pool_pb2_grpc.PoolStub(ch).AcquireLease(
            pool_pb2.AcquireLeaseRequest(size=1 << 20, ttl_ms=60000), timeout=10)
        r = transfer_pb2_grpc.TransferStub(ch).Submit(transfer_pb2.SubmitRequest(
            requests=[req(transfer_pb2.WRITE, seg.id, b.h2c, dst.id, 16)], wait=True),
            timeout=20)
        assert r.batch.state == transfer_pb2.DONE
    status = json.loads(d.ops_get("/status.json")[1])
    assert status["leases"]["live"] == 1 and status["pools"][0]["capacity"] == 8 << 20
    assert [p["address"] for p in status["peers"]] == [b.h2c]
    assert "tenant" not in json.dumps(status)  # nothing of any tenant
    url = "http://%s:%d/" % (d.host, d.ops_port)
    rc, dom, err = chromium("--dump-dom", url)
    assert rc == 0, err[-2000:]
    # what the script rendered from /status.json: this daemon's values, not placeholders
    assert '<span id="state" class="ok">serving</span>' in dom, dom[:2000]
    assert "<td>%s</td>" % status["epoch"] in dom
    assert "<td>default</td><td>8.0 MiB</td><td>1.0 MiB</td>" in dom  # capacity, in use
    assert "<td>1 live</td>" in dom
    assert "<td>%s</td><td>open</td><td>tcp</td>" % b.h2c in dom
    assert '<div id="err"></div>' in dom  # no fetch error shown
    shot = str(tmp_path / "status.png")
    rc, out, err = chromium("--window-size=1000,800", "--screenshot=" + shot, url)
    assert rc == 0 and os.path.getsize(shot) > 5000, err[-2000:]
    width, height, raw = png_pixels(shot)
    assert (width, height) == (1000, 800)
    # a rendered page: many distinct byte values (text, borders, colours), not one background
    assert len(set(raw[::7])) > 20
    with h2c_channel(d) as ch:
        pool_pb2_grpc.PoolStub(ch).ReleaseLease(pool_pb2.ReleaseLeaseRequest(id=lease.id),
                                                timeout=10)
