"""A private certificate authority and the local broker's TLS keystore, made with the JDK's keytool.

The CA signs one certificate for the broker whose subject alternative names are the host's names
(`localhost`, `127.0.0.1`, the hostname and the configured host), so clients verify it with
hostname verification on. Store passwords are random, live in a file only the owner can read and
reach keytool as `-storepass:file`, never on a command line.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pipelines.errors import JobFailedError


class CertificateError(JobFailedError):
    """keytool could not make a certificate; the message has its output."""


@dataclass(frozen=True)
class BrokerTls:
    """The files of the broker's TLS: its keystore (PKCS12) and the CA clients must trust (PEM)."""

    dir: Path

    @property
    def ca_pem(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def keystore(self) -> Path:
        return self.dir / "broker.p12"

    @property
    def password_file(self) -> Path:
        return self.dir / "store.pass"

    def store_password(self) -> str:
        return self.password_file.read_text().strip()


def host_names(host: str) -> list[str]:
    """The names a client may use for this machine's broker, `host` first."""
    names = [host, "localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn()]
    return list(dict.fromkeys(n for n in names if n))


def _san(names: list[str]) -> str:
    def entry(name: str) -> str:
        try:
            return f"ip:{ipaddress.ip_address(name)}"
        except ValueError:
            return f"dns:{name}"

    return "SAN=" + ",".join(entry(n) for n in names)


def _keytool(java: str, *args: str, password_file: Path) -> None:
    keytool = Path(java).resolve().with_name("keytool")
    cmd = [str(keytool), *args, "-storepass:file", str(password_file)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise CertificateError(
            f"keytool {args[0]} failed: {(done.stderr or done.stdout).strip()[-600:]}"
        )


def _private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (it holds a password): a new file, made private
    before it holds anything, then renamed over the old one (whose mode and open readers it
    does not inherit)."""
    work = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(work, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(work, path)
    except BaseException:
        work.unlink(missing_ok=True)
        raise


def new_password_file(path: Path) -> None:
    """A random password in a file only its owner can read."""
    write_private(path, secrets.token_urlsafe(24))


def make_ca(java: str, folder: Path, name: str) -> Path:
    """A new self-signed CA in `folder` (ca.p12 with its key, ca.pem for clients); the PEM path."""
    _private_dir(folder)
    secret = folder / "store.pass"
    if not secret.exists():
        new_password_file(secret)
    store = ["-keystore", str(folder / "ca.p12"), "-storetype", "PKCS12"]
    _keytool(
        java, "-genkeypair", "-alias", "ca", "-dname", f"CN={name}", "-keyalg", "EC",
        "-groupname", "secp256r1", "-validity", "3650", "-ext", "bc:c", *store,
        password_file=secret,
    )  # fmt: skip
    pem = folder / "ca.pem"
    _keytool(java, "-exportcert", "-rfc", "-alias", "ca", *store, "-file", str(pem),
             password_file=secret)  # fmt: skip
    return pem


def ensure_broker_tls(java: str, folder: Path, names: list[str]) -> BrokerTls:
    """The CA and the broker's keystore in `folder`, made once (in a side folder, renamed when
    complete): a later start reuses them, so clients keep trusting the same CA."""
    if (folder / "broker.p12").exists():
        return BrokerTls(folder)
    work = folder.with_name(folder.name + ".new")
    shutil.rmtree(work, ignore_errors=True)  # a half-made set from an interrupted start
    make_ca(java, work, "lakehouse local Kafka CA")
    tls = BrokerTls(work)
    secret, ca_store = tls.password_file, ["-keystore", str(work / "ca.p12")]
    store = ["-keystore", str(tls.keystore), "-storetype", "PKCS12"]
    csr, signed = work / "broker.csr", work / "broker.pem"
    _keytool(
        java, "-genkeypair", "-alias", "broker", "-dname", f"CN={names[0]}", "-keyalg", "EC",
        "-groupname", "secp256r1", "-validity", "825", *store, password_file=secret,
    )  # fmt: skip
    _keytool(java, "-certreq", "-alias", "broker", *store, "-file", str(csr),
             password_file=secret)  # fmt: skip
    _keytool(
        java, "-gencert", "-alias", "ca", *ca_store, "-infile", str(csr), "-outfile", str(signed),
        "-rfc", "-validity", "825", "-ext", _san(names),
        "-ext", "KU=digitalSignature,keyAgreement", "-ext", "EKU=serverAuth,clientAuth",
        password_file=secret,
    )  # fmt: skip
    _keytool(java, "-importcert", "-noprompt", "-alias", "ca", "-file", str(tls.ca_pem), *store,
             password_file=secret)  # fmt: skip
    _keytool(java, "-importcert", "-alias", "broker", "-file", str(signed), *store,
             password_file=secret)  # fmt: skip
    csr.unlink()
    shutil.rmtree(folder, ignore_errors=True)
    work.rename(folder)
    return BrokerTls(folder)
