"""The Python package installs offline, as docs/python.md says: a venv with the system's site
packages (Debian's grpcio) and `pip install --no-build-isolation --no-index` of clients/python;
the installed package carries its stubs and needs nothing of the source tree, and Mooncake's
`from mooncake.engine import TransferEngine` and NIXL's `from nixl._api import nixl_agent` work
with the shim it prints first on PYTHONPATH, against a real daemon."""
import os
import shutil
import subprocess

import conftest

SCRIPT = r"""
import moongate, moongate.v1.transfer_pb2 as t
from moongate.pool import BufferPool
assert "site-packages" in t.__file__, t.__file__
import os
with moongate.Client("unix:" + os.environ["MOONGATE_SOCKET"]) as c:
    with BufferPool(1 << 20, client=c) as pool, pool.acquire(4096) as lease:
        lease.buffer[:2] = b"ok"
print("installed", moongate.__file__)
"""

MOONCAKE = r"""
from mooncake.engine import TransferEngine
e = TransferEngine()
assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
addr = e.allocate_managed_buffer(1 << 20)
assert addr and e.memory_kind(addr) == "descriptor" and e.get_rpc_port() >= 20000
print("mooncake", e.get_rpc_port())
"""

NIXL = r"""
from nixl._api import nixl_agent, nixl_agent_config
from nixl._bindings import nixlXferTelemetry, nixlNotFoundError
a = nixl_agent("installed-nixl", nixl_agent_config(backends=["UCX"]))
assert a.get_agent_metadata() and "UCX" in a.get_plugin_list()
print("nixl", a.name)
"""


def test_venv_install_offline(make_daemon, tmp_path):
    d = make_daemon("--pool-bytes", "8M")
    src = tmp_path / "src"  # a copy: the build leaves nothing in the tree
    shutil.copytree(os.path.join(conftest.ROOT, "clients", "python"), src / "clients" / "python",
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    shutil.copytree(os.path.join(conftest.ROOT, "proto"), src / "proto")
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    py = str(venv / "bin" / "python")
    run = subprocess.run([py, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-index",
                          str(src / "clients" / "python")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MOONGATE_PYGEN")}
    env["MOONGATE_SOCKET"] = d.sock
    shutil.rmtree(src)  # the installed package stands alone
    out = subprocess.run([py, "-c", SCRIPT], env=env, cwd=str(tmp_path), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "installed" in out.stdout, out.stderr
    path = subprocess.run([py, "-m", "moongate.compat.mooncake", "--pythonpath"], env=env,
                          capture_output=True, text=True, check=True).stdout.strip()
    out = subprocess.run([py, "-c", MOONCAKE], env=dict(env, PYTHONPATH=path), cwd=str(tmp_path),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "mooncake" in out.stdout, out.stderr
    path = subprocess.run([py, "-m", "moongate.compat.nixl", "--pythonpath"], env=env,
                          capture_output=True, text=True, check=True).stdout.strip()
    out = subprocess.run([py, "-c", NIXL], env=dict(env, PYTHONPATH=path), cwd=str(tmp_path),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "nixl installed-nixl" in out.stdout, out.stderr
