"""A real S3 endpoint on this machine: S3Proxy (Maven Central) with its filesystem backend.

`lakehouse storage start | stop | status`. Objects are plain files under
`local_storage.data_dir/objects/<bucket>/<key>`; a conditional PUT (`If-None-Match: *`, which
Delta commits through the project's log store and delta-rs rely on) is a hard link there, atomic.
The access keys come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, as for every client; they
reach S3Proxy in a 0600 properties file, never on a command line.
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pipelines.config import LakehouseConf
from pipelines.errors import ConfigError, JobFailedError
from pipelines.local.jars import RESOURCES, java_executable, s3proxy_jars
from pipelines.local.processes import pid_of, port_in_use, start_service, stop_service
from pipelines.local.tls import write_private

KEY_ENV, SECRET_ENV = "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"
MAIN = "org.gaul.s3proxy.Main"
LOGBACK = RESOURCES / "s3proxy-logback.xml"


class LocalStorageError(JobFailedError):
    """The local S3 server cannot start or answer; the message says why."""


class MissingKeysError(ConfigError):
    """The S3 access keys are not in the environment; the message names the variables."""


@dataclass(frozen=True)
class StorageStatus:
    running: bool
    pid: int | None
    endpoint: str
    detail: str


def endpoint(conf: LakehouseConf) -> str:
    s = conf.local_storage
    return f"http://{s.host}:{s.port}"


def _paths(conf: LakehouseConf) -> dict[str, Path]:
    d = conf.storage_data_dir
    return {
        "dir": d,
        "objects": d / "objects",
        "props": d / "s3proxy.properties",
        "pid": d / "s3proxy.pid",
        "out": d / "s3proxy.out",
    }


def keys() -> tuple[str, str]:
    """The access key id and secret from the environment, or an error naming what is missing."""
    missing = [name for name in (KEY_ENV, SECRET_ENV) if not os.environ.get(name)]
    if missing:
        raise MissingKeysError(
            f"set {' and '.join(missing)}: the local S3 server and its clients (Spark's S3A, "
            "delta-rs) take their keys from the environment, never from a file"
        )
    return os.environ[KEY_ENV], os.environ[SECRET_ENV]


def bucket_of(conf: LakehouseConf) -> str | None:
    """The bucket of an s3a:// storage root, if the root is on this endpoint."""
    match = re.fullmatch(r"s3a://([^/]+)(/.*)?", conf.root)
    ours = (conf.storage.s3.endpoint or "").rstrip("/") == endpoint(conf)
    return match.group(1) if match and ours else None


def _pid(conf: LakehouseConf) -> int | None:
    """The pid of our S3Proxy, if it runs (its command line names our properties file)."""
    p = _paths(conf)
    return pid_of(p["pid"], MAIN, str(p["props"]))


def _answers(conf: LakehouseConf) -> bool:
    """Whether an S3 server answers at the endpoint (an anonymous request is refused in S3's
    words: an XML error, 403)."""
    try:
        with urllib.request.urlopen(endpoint(conf) + "/", timeout=2) as r:
            body = r.read()
    except urllib.error.HTTPError as e:
        body = e.read()
    except OSError:
        return False
    return b"<Error>" in body or b"ListAllMyBucketsResult" in body


def status(conf: LakehouseConf) -> StorageStatus:
    """Whether our S3 server runs and answers at its endpoint."""
    pid, url, s = _pid(conf), endpoint(conf), conf.local_storage
    if pid is None:
        if port_in_use(s.host, s.port):
            return StorageStatus(False, None, url, f"port {s.port} is used by another process")
        return StorageStatus(False, None, url, "not running")
    if _answers(conf):
        where = _paths(conf)["objects"]
        return StorageStatus(True, pid, url, f"running (pid {pid}) at {url}, objects in {where}")
    return StorageStatus(False, pid, url, f"process {pid} is up but not answering at {url}")


def start(conf: LakehouseConf, *, quiet: bool = False) -> StorageStatus:
    """Start S3Proxy unless it runs, with the storage root's bucket, and wait until it answers."""
    say = (lambda *_: None) if quiet else print
    s, p = conf.local_storage, _paths(conf)
    key, secret = keys()
    if bucket := bucket_of(conf):  # a bucket is a folder of the filesystem backend
        (p["objects"] / bucket).mkdir(parents=True, exist_ok=True)
    p["objects"].mkdir(parents=True, exist_ok=True)
    props = {
        "s3proxy.endpoint": endpoint(conf),
        "s3proxy.authorization": "aws-v2-or-v4",
        "s3proxy.identity": key,
        "s3proxy.credential": secret,
        "jclouds.provider": "filesystem-nio2",
        "jclouds.filesystem.basedir": str(p["objects"]),
    }
    write_private(p["props"], "".join(f"{k}={v}\n" for k, v in props.items()))
    current = status(conf)
    if current.running:
        say(f"storage: already {current.detail}")
        return current
    if current.pid is None and port_in_use(s.host, s.port):
        raise LocalStorageError(f"cannot start S3 at {current.endpoint}: {current.detail}")
    heap = [f"-Xmx{s.heap}", "-XX:+UseSerialGC", f"-Dlogback.configurationFile={LOGBACK}"]
    cmd = [java_executable(), *heap, "-cp", f"{s3proxy_jars(s.version)}/*", MAIN]
    cmd += ["--properties", str(p["props"])]
    say(f"storage: starting S3Proxy {s.version} at {current.endpoint}, objects in {p['objects']}")
    start_service(
        cmd,
        what=f"S3Proxy at {current.endpoint}",
        log=p["out"],
        pid_file=p["pid"],
        ready=lambda: _answers(conf),
        timeout_s=s.start_timeout_s,
        error=LocalStorageError,
    )
    st = status(conf)
    say(f"storage: {st.detail}")
    return st


def stop(conf: LakehouseConf, *, quiet: bool = False) -> None:
    """Stop S3Proxy (SIGTERM, then SIGKILL if it hangs); the objects stay."""
    done = stop_service("storage", _pid(conf), _paths(conf)["pid"])
    if not quiet:
        print(done)


def ensure_folder(conf: LakehouseConf, where: str) -> None:
    """Create the folder `where` (local, or s3a:// on the root's endpoint) if it is missing,
    without a Spark session (before one exists, or in a service of its own)."""
    if not where.startswith("s3a://"):
        Path(where.removeprefix("file:")).mkdir(parents=True, exist_ok=True)
        return
    from pyarrow.fs import S3FileSystem  # pylint: disable=no-name-in-module

    s3, options = conf.storage.s3, {}
    if s3.endpoint:
        scheme, _, host = s3.endpoint.partition("://")
        options = {"endpoint_override": host.rstrip("/"), "scheme": scheme}
    fs = S3FileSystem(
        region=s3.region, force_virtual_addressing=not s3.path_style_access, **options
    )
    fs.create_dir(where.removeprefix("s3a://"))  # a folder marker, as S3A makes one
