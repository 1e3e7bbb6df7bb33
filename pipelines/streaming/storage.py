"""Files under the storage root through Hadoop's FileSystem API: a local folder, s3a:// and any
other Hadoop file system by the same code, with the session's endpoint and credentials. Nothing
here touches a storage path with pathlib or os."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from py4j.java_gateway import JavaClass
from pyspark.sql import SparkSession

CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite"  # Hadoop 3.5: If-None-Match on S3


def jvm_class(spark: SparkSession, name: str) -> Any:
    """The JVM class of full name `name`, as `spark._jvm.<name>` without its lookup: py4j asks
    the JVM about each prefix of the name in turn (~2 ms a name; the class itself: none)."""
    gateway: Any = spark.sparkContext._gateway  # set while the session runs
    return JavaClass(name, gateway._gateway_client)


class Files:
    """`Files(spark).read_text("s3a://bucket/x/_checkpoints/bronze/offsets/3")`, and so on."""

    def __init__(self, spark: SparkSession) -> None:
        self.path = jvm_class(spark, "org.apache.hadoop.fs.Path")
        self.io = jvm_class(spark, "org.apache.commons.io.IOUtils")
        self.hadoop = spark._jsc.hadoopConfiguration()

    def _fs(self, path: str):
        p = self.path(str(path))
        return p, p.getFileSystem(self.hadoop)

    def exists(self, path: str) -> bool:
        p, fs = self._fs(path)
        return bool(fs.exists(p))

    def read_text(self, path: str) -> str | None:
        """The file's text (undecodable bytes replaced); None if there is no such file."""
        p, fs = self._fs(path)
        try:
            stream = fs.open(p)
        except Exception as e:  # py4j: FileNotFoundException
            if "FileNotFoundException" in str(e) or not fs.exists(p):
                return None
            raise
        try:
            data = bytes(self.io.toByteArray(stream))
        finally:
            stream.close()
        return data.decode("utf-8", errors="replace")

    def write_text(self, path: str, text: str) -> None:
        """Write (or replace) the file; a reader sees the old text or the new, never a part
        (a local disk: a new file renamed over it; an object store: a PUT on close)."""
        p, fs = self._fs(path)
        if fs.getScheme() == "file":
            _replace_local(Path(p.toUri().getPath()), text)
            return
        stream = fs.create(p, True)
        try:
            stream.write(bytearray(text.encode()))
        finally:
            stream.close()

    def create_new(self, path: str, text: str) -> bool:
        """Create the file only if nobody has, atomically even across machines; False if it
        exists. S3 through a conditional PUT (If-None-Match), HDFS, GCS and ABFS by their own
        exclusive create, a local disk with O_EXCL."""
        p, fs = self._fs(path)
        if fs.getScheme() == "file":
            return _create_local(Path(p.toUri().getPath()), text)
        try:
            if fs.hasPathCapability(p, CONDITIONAL_CREATE):
                builder = fs.createFile(p).overwrite(True)
                builder.must(CONDITIONAL_CREATE, True)
                stream = builder.build()
            else:
                stream = fs.create(p, False)
            stream.write(bytearray(text.encode()))
            stream.close()
        except Exception as e:  # py4j: FileAlreadyExistsException, or 412 Precondition Failed
            message = str(e)
            if any(s in message for s in ("exist", "412", "PreconditionFailed", "FileChanged")):
                return False
            raise
        return True

    def names(self, folder: str) -> list[str]:
        """The names in a folder ([] if there is no such folder)."""
        p, fs = self._fs(folder)
        try:
            return [s.getPath().getName() for s in fs.listStatus(p)]
        except Exception as e:
            if "FileNotFoundException" in str(e) or not fs.exists(p):
                return []
            raise

    def modified_s(self, path: str) -> float:
        """When the file was last written, in seconds since the epoch."""
        p, fs = self._fs(path)
        return fs.getFileStatus(p).getModificationTime() / 1000

    def mkdirs(self, folder: str) -> None:
        p, fs = self._fs(folder)
        fs.mkdirs(p)

    def delete(self, path: str, recursive: bool = False) -> bool:
        p, fs = self._fs(path)
        return bool(fs.delete(p, recursive))

    def download(self, folder: str, local: Path) -> bool:
        """Copy a folder of the store into a local folder; False if it does not exist."""
        p, fs = self._fs(folder)
        if not fs.exists(p):
            return False
        local.parent.mkdir(parents=True, exist_ok=True)
        fs.copyToLocalFile(False, p, self.path(local.as_uri()), True)
        return True

    def upload(self, local: Path, folder: str) -> None:
        """Copy a local folder's files into a folder of the store, replacing what is there."""
        p, fs = self._fs(folder)
        for file in sorted(f for f in local.rglob("*") if f.is_file()):
            target = self.path(p, file.relative_to(local).as_posix())
            fs.copyFromLocalFile(False, True, self.path(file.as_uri()), target)


def _staged(file: Path, text: str) -> Path:
    """`text` in a hidden file beside `file`, flushed, for an atomic rename or link."""
    file.parent.mkdir(parents=True, exist_ok=True)
    staged = file.with_name(f".{file.name}.{uuid.uuid4().hex}.tmp")
    with staged.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return staged


def _replace_local(file: Path, text: str) -> None:
    os.replace(_staged(file, text), file)
    # a checksum Hadoop wrote for the old text would fail the next read through Hadoop
    file.with_name(f".{file.name}.crc").unlink(missing_ok=True)


def _create_local(file: Path, text: str) -> bool:
    """A hard link fails if `file` exists, and shows it whole: never empty, never a part."""
    staged = _staged(file, text)
    try:
        os.link(staged, file)
    except FileExistsError:
        return False
    finally:
        staged.unlink()
    return True
