"""Process harness for real Flower (flwr 1.41) deployments on loopback.

A plain module (no pytest fixtures).  ``LoopbackFederation`` starts one
``flower-superlink`` and N ``flower-supernode`` processes on 127.0.0.1,
optionally with TLS and SuperNode authentication, runs ``flwr run <app> <conn>
--stream`` against them and stops *every* process it caused to exist.

Process bookkeeping: every process is started with a unique marker in its
environment (``TRUSTFL_FLWR_HARNESS=<uuid>``).  Flower spawns grandchildren we
do not own a ``Popen`` for (``flower-superexec`` - started by the SuperLink in a
new session - then ``flwr-serverapp`` / ``flwr-clientapp``), all of which
inherit the environment; ``close()`` finds them by scanning ``/proc/*/environ``
for the marker and signals each by PID (SIGTERM, bounded wait, SIGKILL).

Facts about flwr 1.41 this relies on:

* SuperLink serves Fleet, Control and Runtime ("ServerAppIo") APIs over HTTP on
  one port (``--host``/``--port``); the CLI (``flwr run``, ``flwr supernode
  register``) and SuperNodes all use that one address.
* Each SuperNode has its own Runtime HTTP API (``--host``/``--port``) used by
  its SuperExec/ClientApp processes, so each node needs its own port.
* SuperLink/SuperNode launch ``flower-superexec``, ``flwr-serverapp`` and
  ``flwr-clientapp`` by bare name -> the venv ``bin`` must be first on PATH.
* The FAB (app dir) is extracted under ``$FLWR_HOME/apps/...`` and put on
  ``sys.path``; everything else (trustfl, torch) is imported from the venv.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BIN_DIR = Path(sys.executable).parent
MARKER_ENV = "TRUSTFL_FLWR_HARNESS"
CONNECTION = "loopback"


def exe(name: str) -> str:
    """Path of a Flower executable next to the running venv's python."""
    path = BIN_DIR / name
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is flwr installed in this venv?")
    return str(path)


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS considers free right now (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def toml_value(v: Any) -> str:
    """Render a Python scalar as a TOML value (for --node-config)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # JSON string escapes are valid TOML basic strings
    raise TypeError(f"unsupported config value {v!r} ({type(v).__name__})")


def node_config_arg(cfg: dict[str, Any]) -> str:
    """``{"partition-id": 0, "name": "a"}`` -> ``partition-id=0 name="a"``."""
    for k in cfg:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", k):
            raise ValueError(f"bad node-config key {k!r}")
    return " ".join(f"{k}={toml_value(v)}" for k, v in cfg.items())


# --------------------------------------------------------------------------
# key material
# --------------------------------------------------------------------------


@dataclass
class TlsMaterial:
    ca_cert: Path
    server_cert: Path
    server_key: Path


def make_tls_material(directory: str | os.PathLike[str]) -> TlsMaterial:
    """Self-signed CA + server cert (SAN IP:127.0.0.1, DNS:localhost) as PEM files."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trustfl test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    srv_key = ec.generate_private_key(ec.SECP384R1())
    srv_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(srv_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    out = TlsMaterial(d / "ca.crt", d / "server.pem", d / "server.key")
    out.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    out.server_cert.write_bytes(srv_cert.public_bytes(serialization.Encoding.PEM))
    out.server_key.write_bytes(
        srv_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    os.chmod(out.server_key, 0o600)
    return out


@dataclass
class NodeKeys:
    private_key: Path  # OpenSSH private key (what --auth-supernode-private-key reads)
    public_key: Path  # OpenSSH public key line (what `flwr supernode register` reads)


def make_node_keys(directory: str | os.PathLike[str], name: str) -> NodeKeys:
    """ECDSA P-384 key pair in OpenSSH format (the formats flwr 1.41 loads)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    keys = NodeKeys(d / name, d / f"{name}.pub")
    keys.private_key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    os.chmod(keys.private_key, 0o600)
    keys.public_key.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        + b"\n"
    )
    return keys


# --------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------


@dataclass
class CompletedRun:
    returncode: int | None  # None if killed on timeout
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool
    run_id: int | None  # parsed from "Successfully started run <id>"
    args: list[str] = field(default_factory=list)
    # From `flwr list --run-id <id> --format json`: "finished:completed",
    # "finished:failed", "finished:stopped", "running", ... (None if unknown).
    # NB: `flwr run --stream` exits 0 even when the ServerApp raised; only
    # this status tells (status_details then holds the exception text).
    status: str | None = None
    status_details: str | None = None

    @property
    def ok(self) -> bool:
        return (
            self.returncode == 0 and not self.timed_out and self.status == "finished:completed"
        )


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


def _pid_exists(pid: int) -> bool:
    """True while /proc/<pid> exists (a zombie counts: it still shows in pgrep)."""
    return os.path.exists(f"/proc/{pid}")


def _pids_with_marker(marker: str) -> list[int]:
    """PIDs of live (non-zombie) processes whose environment holds marker."""
    needle = f"{MARKER_ENV}={marker}".encode()
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
            if needle not in env.split(b"\0"):
                continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
            if state in (b"Z", b"X"):
                continue
            found.append(int(entry))
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue
    return found


def _descendants(root: int) -> list[int]:
    """All descendant PIDs of root (from /proc/*/stat ppid fields)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class LoopbackFederation:
    """SuperLink + N SuperNodes on 127.0.0.1; a context manager.

    >>> with LoopbackFederation(app_dir, 3, tmp_dir=tmp) as fed:
    ...     res = fed.run({"result-path": str(tmp / "r.json")}, timeout=300)
    ...     assert res.ok, res.stderr
    """

    def __init__(
        self,
        app_dir: str | os.PathLike[str],
        num_nodes: int,
        node_configs: list[dict[str, Any]] | None = None,
        tls: bool = False,
        node_auth: bool = False,
        tmp_dir: str | os.PathLike[str] | None = None,
        *,
        startup_timeout: float = 90.0,
        stop_timeout: float = 15.0,
        superexec_poll_interval: float | None = 0.1,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        if node_auth and not tls:
            raise ValueError("flwr 1.41: --enable-supernode-auth requires TLS (tls=True)")
        if node_configs is not None and len(node_configs) != num_nodes:
            raise ValueError("node_configs must have one dict per node")
        if tmp_dir is None:
            import tempfile

            tmp_dir = tempfile.mkdtemp(prefix="flwr-loopback-")
        self.app_dir = Path(app_dir).resolve()
        self.num_nodes = num_nodes
        self.node_configs = node_configs or [
            {"partition-id": k, "num-partitions": num_nodes} for k in range(num_nodes)
        ]
        self.tls = tls
        self.node_auth = node_auth
        self.tmp_dir = Path(tmp_dir).resolve()
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.marker = uuid.uuid4().hex
        self.superlink_port: int | None = None
        self.tls_material: TlsMaterial | None = None
        self.node_keys: list[NodeKeys | None] = []
        self.node_ids: list[int | None] = []  # SuperNode IDs from the logs
        self.superlink: _Proc | None = None
        self.nodes: list[_Proc] = []
        self._closed = False
        self._run_counter = 0
        self._seen_pids: set[int] = set()
        self.startup_seconds: float | None = None  # wall time of start()
        env = dict(os.environ)
        env["PATH"] = f"{BIN_DIR}{os.pathsep}{env.get('PATH', '')}"
        env["FLWR_TELEMETRY_ENABLED"] = "0"
        env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        env[MARKER_ENV] = self.marker
        if superexec_poll_interval is not None:
            env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(superexec_poll_interval)
        env.pop("FLWR_HOME", None)
        env.update(extra_env or {})
        self._env = env
        self.cli_home = self.tmp_dir / "flwr_home_cli"

    # ---------------------------------------------------------------- setup

    def __enter__(self) -> LoopbackFederation:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spawn(self, name: str, args: list[str], home: Path) -> _Proc:
        log = self.tmp_dir / f"{name}.log"
        home.mkdir(parents=True, exist_ok=True)
        env = dict(self._env, FLWR_HOME=str(home))
        with open(log, "wb") as fh:
            popen = subprocess.Popen(
                args, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, cwd=str(self.tmp_dir), start_new_session=True,
            )
        return _Proc(name, popen, log)

    def start(self) -> None:
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self.superlink_port = free_port()
        link_args = [
            exe("flower-superlink"), "--host", "127.0.0.1", "--port", str(self.superlink_port),
            "--disable-runtime-dependency-installation",
        ]
        if self.tls:
            self.tls_material = make_tls_material(self.tmp_dir / "tls")
            link_args += [
                "--ssl-ca-certfile", str(self.tls_material.ca_cert),
                "--ssl-certfile", str(self.tls_material.server_cert),
                "--ssl-keyfile", str(self.tls_material.server_key),
            ]
        else:
            link_args.append("--insecure")
        if self.node_auth:
            link_args.append("--enable-supernode-auth")
        self.superlink = self._spawn("superlink", link_args, self.tmp_dir / "flwr_home_superlink")
        self._write_cli_config()
        self._wait(lambda: _port_open(self.superlink_port), t0, "SuperLink port", self.superlink)
        for k in range(self.num_nodes):
            self.add_node(self.node_configs[k], register=True, wait=False)
        for k in range(self.num_nodes):
            self.wait_node_ready(k, deadline_from=t0)
        self.startup_seconds = time.monotonic() - t0

    def _write_cli_config(self) -> None:
        self.cli_home.mkdir(parents=True, exist_ok=True)
        lines = [
            "[superlink]",
            f'default = "{CONNECTION}"',
            "",
            f"[superlink.{CONNECTION}]",
            f'address = "127.0.0.1:{self.superlink_port}"',
        ]
        if self.tls:
            assert self.tls_material is not None
            lines.append(f"root-certificates = {json.dumps(str(self.tls_material.ca_cert))}")
        else:
            lines.append("insecure = true")
        (self.cli_home / "config.toml").write_text("\n".join(lines) + "\n")

    def _wait(self, cond, t0: float, what: str, proc: _Proc | None = None) -> None:
        while not cond():
            if proc is not None and proc.popen.poll() is not None:
                raise RuntimeError(
                    f"{proc.name} exited with {proc.popen.returncode} while waiting for {what}; "
                    f"log tail:\n{self.log_tail(proc.name)}"
                )
            if time.monotonic() - t0 > self.startup_timeout:
                raise TimeoutError(f"timed out waiting for {what}; see logs in {self.tmp_dir}")
            time.sleep(0.1)

    def cli(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run ``flwr <args>`` with this federation's FLWR_HOME (config.toml)."""
        env = dict(self._env, FLWR_HOME=str(self.cli_home))
        return subprocess.run(
            [exe("flwr"), *args], env=env, cwd=str(self.tmp_dir), capture_output=True,
            text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )

    def register_node_key(self, public_key: Path) -> int:
        """``flwr supernode register <pub> <conn> --format json`` -> node id."""
        res = self.cli("supernode", "register", str(public_key), CONNECTION, "--format", "json")
        if res.returncode != 0:
            raise RuntimeError(f"flwr supernode register failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
        m = re.search(r'"node-id"\s*:\s*(\d+)', res.stdout)
        if not m:
            raise RuntimeError(f"cannot parse node id from {res.stdout!r}")
        return int(m.group(1))

    def add_node(
        self, node_config: dict[str, Any] | None = None, *, register: bool = True,
        wait: bool = True, keys: NodeKeys | None = None,
    ) -> int:
        """Start one more SuperNode; returns its index k (for kill_node/log_tail).

        With node_auth, a fresh key pair is made and registered (unless
        register=False, which yields a node the SuperLink must refuse).
        """
        assert self.superlink_port is not None
        k = len(self.nodes)
        name = f"supernode{k}"
        args = [
            exe("flower-supernode"), "--superlink", f"127.0.0.1:{self.superlink_port}",
            "--host", "127.0.0.1", "--port", str(free_port()),
        ]
        if node_config:
            args += ["--node-config", node_config_arg(node_config)]
        if self.tls:
            assert self.tls_material is not None
            args += ["--root-certificates", str(self.tls_material.ca_cert)]
        else:
            args.append("--insecure")
        if self.node_auth:
            keys = keys or make_node_keys(self.tmp_dir / "node_keys", name)
            if register:
                self.register_node_key(keys.public_key)
            args += ["--auth-supernode-private-key", str(keys.private_key)]
        self.node_keys.append(keys)
        self.node_ids.append(None)
        self.nodes.append(self._spawn(name, args, self.tmp_dir / f"flwr_home_{name}"))
        if wait:
            self.wait_node_ready(k)
        return k

    def wait_node_ready(self, k: int, deadline_from: float | None = None) -> int:
        """Wait until SuperNode k logged its node ID (connected + activated)."""
        t0 = deadline_from if deadline_from is not None else time.monotonic()
        proc = self.nodes[k]
        pat = re.compile(r"SuperNode ID: (\d+)")

        def ready() -> bool:
            m = pat.search(self.log_text(proc.name))
            if m:
                self.node_ids[k] = int(m.group(1))
            return m is not None

        self._wait(ready, t0, f"{proc.name} ready", proc)
        return int(self.node_ids[k])  # type: ignore[arg-type]

    # ------------------------------------------------------------------ use

    def run(self, run_config: dict[str, Any] | None = None, timeout: float = 300.0) -> CompletedRun:
        """``flwr run <app_dir> loopback --stream --run-config <toml file>``.

        Keys of run_config must exist in the app's [tool.flwr.app.config].
        On timeout the CLI process group is SIGKILLed and ``flwr stop`` is
        sent for the run (if its id was printed).
        """
        import tomli_w

        self._run_counter += 1
        args = [exe("flwr"), "run", str(self.app_dir), CONNECTION, "--stream"]
        if run_config:
            cfg_file = self.tmp_dir / f"run_config_{self._run_counter}.toml"
            cfg_file.write_text(tomli_w.dumps(run_config))
            args += ["--run-config", str(cfg_file)]
        env = dict(self._env, FLWR_HOME=str(self.cli_home))
        out_path = self.tmp_dir / f"flwr_run_{self._run_counter}.stdout"
        err_path = self.tmp_dir / f"flwr_run_{self._run_counter}.stderr"
        t0 = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            p = subprocess.Popen(
                args, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                cwd=str(self.tmp_dir), start_new_session=True,
            )
            timed_out = False
            try:
                rc: int | None = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                rc = None
                _signal(-p.pid, signal.SIGKILL)
                p.wait()
        stdout = out_path.read_text(errors="replace")
        stderr = err_path.read_text(errors="replace")
        m = re.search(r"Successfully started run (\d+)", stdout + stderr)
        run_id = int(m.group(1)) if m else None
        if timed_out and run_id is not None:
            try:
                self.cli("stop", str(run_id), CONNECTION, timeout=30)
            except subprocess.TimeoutExpired:
                pass
        seconds = time.monotonic() - t0
        status = details = None
        if run_id is not None:
            status, details = self.run_status(run_id)
        return CompletedRun(rc, stdout, stderr, seconds, timed_out, run_id, args, status, details)

    def current_run_id(self, timeout: float = 60.0) -> int:
        """The id of the run the latest :meth:`run` started (read from its CLI output while it runs)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = "".join(p.read_text(errors="replace") for p in
                           (self.tmp_dir / f"flwr_run_{self._run_counter}.{ext}" for ext in ("stdout", "stderr"))
                           if p.is_file())
            m = re.search(r"Successfully started run (\d+)", text)
            if m:
                return int(m.group(1))
            time.sleep(0.1)
        raise TimeoutError(f"run {self._run_counter} printed no run id in {timeout:g} s")

    def run_status(self, run_id: int) -> tuple[str | None, str | None]:
        """(status, status-details) of a run via ``flwr list --run-id``."""
        try:
            res = self.cli("list", "--run-id", str(run_id), CONNECTION, "--format", "json", timeout=30)
            runs = json.loads(res.stdout)["runs"]
            return runs[0].get("status"), runs[0].get("status-details")
        except (subprocess.TimeoutExpired, ValueError, KeyError, IndexError):
            return None, None

    def kill_node(self, k: int, tree: bool = True) -> None:
        """SIGKILL SuperNode k by PID.

        tree=True (default) also SIGKILLs its descendants (its flower-superexec
        and any running flwr-clientapp), i.e. a whole-machine crash.  With
        tree=False they linger (they only notice the dead parent later via
        --parent-pid); close() reaps them either way.
        """
        proc = self.nodes[k]
        victims = _descendants(proc.popen.pid) if tree else []
        _signal(proc.popen.pid, signal.SIGKILL)
        for pid in victims:
            _signal(pid, signal.SIGKILL)
        proc.popen.wait(timeout=10)

    def log_text(self, name: str) -> str:
        try:
            return (self.tmp_dir / f"{name}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, name: str, n: int = 40) -> str:
        return "\n".join(self.log_text(name).splitlines()[-n:])

    def live_pids(self) -> list[int]:
        """All live processes (any depth) started by this federation."""
        pids = _pids_with_marker(self.marker)
        self._seen_pids.update(pids)
        return pids

    # ---------------------------------------------------------------- close

    def close(self) -> None:
        """Stop everything by PID: SIGTERM, bounded wait, SIGKILL. Idempotent."""
        if self._closed:
            return
        self._closed = True
        own = [p.popen for p in [self.superlink, *self.nodes] if p is not None]
        # Nodes first, SuperLink last; then every marked descendant.
        for p in reversed(own):
            if p.poll() is None:
                _signal(p.pid, signal.SIGTERM)
        for pid in self.live_pids():
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        while time.monotonic() < deadline:
            for p in own:
                p.poll()
            if all(p.returncode is not None for p in own) and not self.live_pids():
                break
            time.sleep(0.2)
        for _ in range(3):
            for p in own:
                if p.poll() is None:
                    _signal(p.pid, signal.SIGKILL)
            leftover = self.live_pids()
            for pid in leftover:
                _signal(pid, signal.SIGKILL)
            for p in own:
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            if not leftover and all(p.returncode is not None for p in own):
                break
            time.sleep(0.3)
        remaining = self.live_pids()
        if remaining:
            raise RuntimeError(f"processes survived SIGKILL: {remaining}")
        # Orphaned children turn into zombies until init reaps them (they still
        # match `pgrep -f flower-`); give that a bounded moment.
        own_pids = {p.pid for p in own}
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(
            _pid_exists(pid) for pid in self._seen_pids - own_pids
        ):
            time.sleep(0.1)
