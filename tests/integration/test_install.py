"""`cmake --install` puts the daemon, mgctl, the shared client libraries (libmgclient.so.0 and
libtransfer_engine.so, with their SONAMEs), their headers and moongate-client.pc in a prefix; a
program built from the installed tree alone with pkg-config talks to a daemon."""
import os
import subprocess

import conftest

BUILD = conftest.BUILD


def sanitized():
    """The build's own compile flags a program linking its libraries needs (ASan + UBSan)."""
    return ["-fsanitize=address,undefined"] if conftest.sanitized() else []


def soname(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True)
    return [ln.split("[")[1].rstrip("]") for ln in out.stdout.splitlines() if "SONAME" in ln]


def test_install_tree_and_a_program_built_from_it(make_daemon, tmp_path):
    prefix = tmp_path / "usr"
    subprocess.run(["cmake", "--install", BUILD, "--prefix", str(prefix)], check=True,
                   capture_output=True)
    lib = prefix / "lib"
    for f in ("bin/moongate", "bin/mgctl", "lib/libtransfer_engine.so", "lib/libmgclient.so.0",
              "include/transfer_engine_c.h", "include/moongate/mg_client.h",
              "include/moongate/mg_grpc.h", "include/moongate/v1/agent.pb-c.h",
              "lib/pkgconfig/moongate-client.pc"):
        assert (prefix / f).exists(), f
    assert soname(str(lib / "libmgclient.so.0")) == ["libmgclient.so.0"]
    assert soname(str(lib / "libtransfer_engine.so")) == ["libtransfer_engine.so"]

    env = dict(os.environ, PKG_CONFIG_PATH=str(lib / "pkgconfig"))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "moongate-client"], env=env,
                           capture_output=True, text=True, check=True).stdout.split()
    exe = tmp_path / "example_agent"
    subprocess.run(["cc", "-o", str(exe), os.path.join(conftest.ROOT, "client",
                                                      "example_agent.c")] + flags + sanitized(),
                   check=True, capture_output=True)
    layout = tmp_path / "te_layout"  # Mooncake's header as installed, its layouts checked
    subprocess.run(["cc", "-o", str(layout), os.path.join(conftest.ROOT, "tests", "te",
                                                         "te_layout.c"),
                    "-I", str(prefix / "include")], check=True, capture_output=True)
    assert subprocess.run([str(layout)], capture_output=True).returncode == 0

    d = make_daemon()
    run = subprocess.run([str(exe), "unix:" + d.sock, "installed-0"], capture_output=True,
                         text=True, timeout=60, env=dict(os.environ, LD_LIBRARY_PATH=str(lib)))
    assert run.returncode == 0 and run.stdout.startswith("ok agent installed-0"), run.stderr
    ldd = subprocess.run(["ldd", str(exe)], capture_output=True, text=True,
                         env=dict(os.environ, LD_LIBRARY_PATH=str(lib))).stdout
    assert str(lib / "libmgclient.so.0") in ldd, ldd
