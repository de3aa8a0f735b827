"""`cmake --install` puts the daemon, mgctl, the shared client libraries (libmgclient.so.0 and
libtransfer_engine.so, with their SONAMEs), their headers and moongate-client.pc in a prefix; a
program built from the installed tree alone with pkg-config talks to a daemon; the installed
transfer_engine_c.h is Mooncake's, type by type and prototype by prototype."""
import os
import re
import subprocess

import pytest

import conftest
from test_mooncake_c import prototypes

BUILD = conftest.BUILD


def sanitized():
    """The build's own compile flags a program linking its libraries needs (ASan + UBSan, or
    ThreadSanitizer)."""
    if conftest.tsan():
        return ["-fsanitize=thread"]
    return ["-fsanitize=address,undefined"] if conftest.sanitized() else []


def soname(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True)
    return [ln.split("[")[1].rstrip("]") for ln in out.stdout.splitlines() if "SONAME" in ln]


def test_install_tree_and_a_program_built_from_it(make_daemon, tmp_path):
    prefix = tmp_path / "usr"
    subprocess.run(["cmake", "--install", BUILD, "--prefix", str(prefix)], check=True,
                   capture_output=True)
    lib = prefix / "lib"
    for f in ("bin/moongate", "bin/mgctl", "bin/mgbench", "lib/libtransfer_engine.so", "lib/libmgclient.so.0",
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
    # ... and against Mooncake's own header: every type, constant, layout and prototype
    abi = tmp_path / "te_mooncake_abi"
    subprocess.run(["cc", "-Werror", "-o", str(abi), os.path.join(conftest.ROOT, "tests", "te",
                                                                 "te_mooncake_abi.c"),
                    "-I", str(prefix / "include")], check=True, capture_output=True)
    assert subprocess.run([str(abi)], capture_output=True).returncode == 0
    theirs = prototypes(os.path.join(conftest.ROOT, "tests", "te", "mooncake"), tmp_path)
    assert prototypes(str(prefix / "include"), tmp_path) == theirs

    d = make_daemon()
    run = subprocess.run([str(exe), "unix:" + d.sock, "installed-0"], capture_output=True,
                         text=True, timeout=60, env=dict(os.environ, LD_LIBRARY_PATH=str(lib)))
    assert run.returncode == 0 and run.stdout.startswith("ok agent installed-0"), run.stderr
    ldd = subprocess.run(["ldd", str(exe)], capture_output=True, text=True,
                         env=dict(os.environ, LD_LIBRARY_PATH=str(lib))).stdout
    assert str(lib / "libmgclient.so.0") in ldd, ldd


GLIBC = ("libc.so", "libm.so", "libdl.so", "libpthread.so", "librt.so", "libresolv.so",
         "libutil.so", "libanl.so", "libmvec.so", "ld-linux", "linux-vdso")


@pytest.mark.skipif(conftest.sanitized() or conftest.tsan(),
                    reason="the bundle is of a release build")
def test_bundle_runs_where_it_is_unpacked(tmp_path):
    """scripts/bundle.sh: unpacked elsewhere, every library but glibc's is found in the bundle
    (the binaries' and libraries' RPATH), its README states the glibc floor, and its check.sh
    moves GPU memory (on the CUDA driver emulator) with the bundle's binaries alone."""
    env = dict(os.environ, MG_BUILD_DIR=BUILD)
    run = subprocess.run([os.path.join(conftest.ROOT, "scripts", "bundle.sh"),
                          str(tmp_path / "out")], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    tarball = run.stdout.strip().splitlines()[-1]
    assert tarball.endswith("-linux-%s.tar.gz" % os.uname().machine), tarball
    where = tmp_path / "elsewhere"
    where.mkdir()
    subprocess.run(["tar", "-C", str(where), "-xzf", tarball], check=True)
    (top,) = list(where.iterdir())
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    elves = [str(top / "bin" / b) for b in ("moongate", "mgctl", "mgbench")] + \
        [str(p) for p in (top / "lib").iterdir() if ".so" in p.name and not p.is_symlink()]
    for f in elves:
        out = subprocess.run(["ldd", f], env=env, capture_output=True, text=True, check=True)
        for line in out.stdout.splitlines():
            name = line.split()[0]
            if any(name.startswith(g) or "/" + g in name for g in GLIBC):
                continue
            assert "=> " + str(top / "lib") in line.replace("/bin/../lib", "/lib"), (f, line)
    readme = (top / "README").read_text()
    assert re.search(r"glibc 2\.\d+ or newer", readme), readme
    check = subprocess.run([str(top / "check.sh"), "--size", "8M", "--rounds", "1",
                            "--ports", conftest.two_free_ports()],
                           env=dict(env, MOONGATE_CUDA_LIB=os.path.join(BUILD,
                                                                        "libmgcuda_emu.so")),
                           capture_output=True, text=True, timeout=480)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "verify: 8388608 bytes written from the device and read back onto it (staged): " \
        "equal" in check.stdout, check.stdout
    assert check.stdout.rstrip().endswith("check.sh: ok"), check.stdout
