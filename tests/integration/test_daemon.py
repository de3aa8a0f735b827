"""The daemon as an operator starts it: --help, configuration errors, TLS file errors, the h2c
loopback rule, IPv6 listeners, the config file and the environment."""
import os
import socket
import subprocess

import grpc
import pytest

from conftest import MGCTL, MOONGATE, free_port
from mgstd import health_pb2, health_pb2_grpc


def run(*args, env=None, timeout=10):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([MOONGATE] + list(args), capture_output=True, text=True, timeout=timeout,
                          env=e)


def base_args(tmp_path):
    """A daemon of its own: its socket, its port and its shm directory (one daemon holds a
    directory at a time, and tests run side by side)."""
    return ["--unix-socket", str(tmp_path / "s.sock"), "--ops-listen", "",
            "--listen", "127.0.0.1:%d" % free_port(), "--shm-dir", str(tmp_path / "shm"),
            "--data-listen", "127.0.0.1:0"]


def test_help_and_version():
    p = run("--help")
    assert p.returncode == 0
    for flag in ("--listen", "--tls-cert", "--max-message-bytes SIZE", "MOONGATE_GRACE",
                 "--unix-socket", "--ops-listen", "--workers N"):
        assert flag in p.stdout
    p = run("--version")
    assert p.returncode == 0 and p.stdout.startswith("moongate ")


@pytest.mark.parametrize("args,needle", [
    (["--workers", "0"], "--workers=0 is outside 1..256"),
    (["--bogus"], 'unknown option "--bogus"'),
    (["--tls-cert", "/x.pem"], "--tls-cert and --tls-key go together"),
    (["--log-level", "loud"], "--log-level"),
])
def test_configuration_errors_exit_2_with_the_reason(args, needle):
    p = run(*args)
    assert p.returncode == 2
    assert needle in p.stderr


def test_environment_errors_name_the_variable():
    p = run(env={"MOONGATE_MAX_MESSAGE_BYTES": "lots"})
    assert p.returncode == 2 and "MOONGATE_MAX_MESSAGE_BYTES" in p.stderr


def test_unreadable_certificate_and_mismatched_key(tmp_path, certs):
    p = run(*base_args(tmp_path), "--tls-cert", str(tmp_path / "missing.pem"), "--tls-key",
            os.path.join(certs, "server.key"))
    assert p.returncode == 1
    assert "cannot load --tls-cert" in p.stderr and "missing.pem" in p.stderr
    assert 'error="No such file or directory"' in p.stderr  # the system call's reason
    p = run(*base_args(tmp_path), "--tls-cert", os.path.join(certs, "server.pem"), "--tls-key",
            os.path.join(certs, "client.key"))
    assert p.returncode == 1 and "does not match" in p.stderr


def test_h2c_only_on_loopback_unless_allowed(tmp_path):
    p = run(*base_args(tmp_path), "--h2c-listen", "0.0.0.0:%d" % free_port())
    assert p.returncode == 1 and "loopback only" in p.stderr


def test_listen_address_in_use_is_a_clear_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = run(*base_args(tmp_path), "--h2c-listen", "127.0.0.1:%d" % port)
    assert p.returncode == 1 and "listen_failed" in p.stderr and str(port) in p.stderr


def test_unix_socket_path_must_not_clobber_a_file(tmp_path):
    f = tmp_path / "not-a-socket"
    f.write_text("keep me")
    p = run("--unix-socket", str(f), "--ops-listen", "", "--listen", "", "--shm-dir",
            str(tmp_path / "shm"))
    assert p.returncode == 1 and "not a socket" in p.stderr
    assert f.read_text() == "keep me"


def _ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this host")
def test_ipv6_listeners(make_daemon):
    port = free_port()
    d = make_daemon("--h2c-listen", "[::1]:%d" % port)
    with grpc.insecure_channel("ipv6:[::1]:%d" % port) as ch:
        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert r.status == health_pb2.HealthCheckResponse.SERVING
    p = subprocess.run([MGCTL, "--target", "[::1]:%d" % port, "--plaintext", "health"],
                       capture_output=True, text=True, timeout=10)
    assert p.returncode == 0 and p.stdout == "SERVING\n"
    assert "[::1]" in d.read_log()


def test_config_file_and_environment(make_daemon, tmp_path):
    cfg = tmp_path / "moongate.conf"
    cfg.write_text("# tuned for the test\nworkers = 3\nqueue-depth = 77\n")
    d = make_daemon("--config", str(cfg))
    assert d.metric("moongate_engine_workers") == 3
    assert d.metric("moongate_engine_queue_depth") == 77


def test_unix_socket_permissions(make_daemon):
    import stat
    d = make_daemon()
    assert stat.S_IMODE(os.stat(d.sock).st_mode) == 0o660
    assert d.stop() == 0
    d = make_daemon("--unix-socket-mode", "0666")
    assert stat.S_IMODE(os.stat(d.sock).st_mode) == 0o666


def test_unix_socket_group(make_daemon):
    """--unix-socket-group gives the socket to a group (the chart's socket.group), so members
    connect with mode 0660; a group that does not exist stops the start-up, naming it."""
    import stat
    d = make_daemon("--unix-socket-group", "2345")
    st = os.stat(d.sock)
    assert st.st_gid == 2345 and stat.S_IMODE(st.st_mode) == 0o660
    assert d.stop() == 0
    with pytest.raises(RuntimeError) as e:
        make_daemon("--unix-socket-group", "no-such-group-here")
    assert "unix_socket_group=no-such-group-here" in str(e.value)
