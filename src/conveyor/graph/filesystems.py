"""The file systems input nodes read themselves: local paths, and S3 through pyarrow's S3 file system.

A path is local (a plain path or a `file:` URI) or `s3://bucket/key`; any other scheme (`s3a://`,
`hdfs://`, ...) is left to Spark's own readers. Quokka's inputs name a `bucket` and a `key`:
`bucket_path` joins them (a local directory, an `s3://` URL, or a bare S3 bucket name as in Quokka).

The S3 file system is set up on the driver, from its environment, and pickled into the Spark
tasks with those settings, so executors need no AWS environment of their own when the driver's
names the keys. Without keys in the environment, AWS's default chain applies on each executor
(instance roles, ~/.aws).
"""

from __future__ import annotations

import functools
import os
from urllib.parse import urlparse

import pyarrow.fs as pafs

from .errors import GraphError

S3_CONNECT_TIMEOUT_S = 10.0
S3_REQUEST_TIMEOUT_S = 60.0  # per request: a block of a CSV split is a few MiB


def local_path(path: str) -> str | None:
    """The local file system path of `path`, or None when it is not local (s3://, s3a://, hdfs://, ...)."""
    parsed = urlparse(path)
    if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and os.name == "nt"):
        return parsed.path if parsed.scheme == "file" else path
    return None


def read_here(path: str, s3: bool = False) -> bool:
    """Whether Conveyor reads `path` itself rather than Spark's readers.

    True for a local path, or with `s3` (an input given in Quokka's bucket + key form) an `s3://`
    one. Other `s3://` paths stay Spark's, as configured for the cluster (EMRFS,
    `spark.hadoop.fs.s3*`).
    """
    return local_path(path) is not None or (s3 and urlparse(path).scheme == "s3")


def file_system(path: str, s3: bool = False) -> tuple[pafs.FileSystem, str] | None:
    """(file system, path in it) for a path Conveyor reads itself (see `read_here`), or None for one Spark must read."""
    if not read_here(path, s3):
        return None
    local = local_path(path)
    if local is not None:
        return pafs.LocalFileSystem(), os.path.abspath(local)
    parsed = urlparse(path)  # s3://, read_here says
    if not parsed.netloc:
        raise GraphError(f"{path!r} names no bucket (expected s3://bucket/key)")
    return s3_file_system(parsed.netloc), f"{parsed.netloc}{parsed.path}".rstrip("/")


def s3_file_system(bucket: str | None = None) -> pafs.S3FileSystem:
    """pyarrow's S3 file system as the driver's environment configures it.

    From AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (an S3-compatible server), AWS_REGION or
    AWS_DEFAULT_REGION, and the keys AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and
    AWS_SESSION_TOKEN). On AWS itself with no region given, `bucket`'s region is asked for here, so
    that the tasks get it with the rest.
    """
    env = os.environ
    # bounded waits: a server that does not answer fails the read (after the SDK's retries), never hangs it
    options: dict[str, str | float] = {"connect_timeout": S3_CONNECT_TIMEOUT_S, "request_timeout": S3_REQUEST_TIMEOUT_S}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        options["endpoint_override"] = parsed.netloc
        options["scheme"] = parsed.scheme
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if not region and not endpoint and bucket:
        region = _bucket_region(bucket)
    if region:
        options["region"] = region
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        options["access_key"] = env["AWS_ACCESS_KEY_ID"]
        options["secret_key"] = env["AWS_SECRET_ACCESS_KEY"]
        if env.get("AWS_SESSION_TOKEN"):
            options["session_token"] = env["AWS_SESSION_TOKEN"]
    return pafs.S3FileSystem(**options)


@functools.lru_cache(maxsize=256)
def _bucket_region(bucket: str) -> str:
    """The region of an AWS bucket, asked once per process; "" when it does not answer.

    Asked within the AWS SDK's own timeouts and retries (~6 s with no network). With "", AWS's
    default applies, and a read names the error.
    """
    try:
        return str(pafs.resolve_s3_region(bucket))
    except OSError:
        return ""


def bucket_path(bucket: object, key: object, what: str) -> str:
    """Quokka's (bucket, key) as one path.

    Under a local directory when `bucket` is one (or a `file:` URI), under the URL when it has a
    scheme (`s3://name`), else in the S3 bucket `bucket`.
    """
    if not isinstance(bucket, str) or not bucket:
        raise GraphError(
            f"{what}: bucket must be a non-empty string (a local directory, an s3:// URL or an S3 bucket name), got {bucket!r}"
        )
    if not isinstance(key, str) or not key:
        raise GraphError(f"{what}: key must be a non-empty string (a file, a directory or a prefix in the bucket), got {key!r}")
    if ".." in key.replace("\\", "/").split("/"):
        raise GraphError(f"{what}: key {key!r} leaves its bucket ('..'): name the file from the bucket down")
    local = local_path(bucket)
    if "://" in bucket and local is None:
        return f"{bucket.rstrip('/')}/{key.lstrip('/')}"
    if local is not None and os.path.isdir(local):
        return os.path.join(local, key.lstrip("/"))  # a key is inside its bucket, as in S3
    if local is not None and (os.sep in bucket or bucket.startswith(".")):
        raise GraphError(f"{what}: bucket {bucket!r} is neither a local directory nor an S3 bucket name")
    return f"s3://{bucket}/{key.lstrip('/')}"
