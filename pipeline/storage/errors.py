"""Storage failures classified in one place: one clean line each (missing credentials, access denied, no
such bucket, no endpoint, a store down or a disk full) and whether the run can resume after it.

These surface from deep inside s3fs/botocore, wrapped or not, in any command. The CLI turns each
into ``error: <what failed> ... <what to fix>`` and exit code 2 instead of a traceback, the same
way for `plan`, `run`, `status` and `demo`.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator

CREDENTIAL_HINT = (
    "credentials come from --storage-option key=/secret=, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
    "AWS_PROFILE or the machine's role (docs/pipeline.md#credentials)"
)
ENDPOINT_HINT = "check --endpoint-url (or AWS_ENDPOINT_URL) and that the store is reachable"
REACH_HINT = "check the URL, --endpoint-url, the network and the credentials (environment or AWS profile)"

# botocore exception class name -> what to fix
_BY_NAME = {
    "NoCredentialsError": "no credentials found; " + CREDENTIAL_HINT,
    "PartialCredentialsError": "incomplete credentials; " + CREDENTIAL_HINT,
    "NoRegionError": "no region set; set AWS_REGION or --storage-option client_kwargs='{region_name: ...}'",
    "EndpointConnectionError": "cannot connect to the endpoint; " + ENDPOINT_HINT,
    "ConnectTimeoutError": "the endpoint timed out; " + ENDPOINT_HINT,
    "ProfileNotFound": "the AWS profile does not exist; check AWS_PROFILE or --storage-option profile=",
}
# S3 error codes (botocore ClientError) -> what to fix
_BY_CODE = {
    "AccessDenied": "access denied; the credentials lack permission for this bucket/prefix. "
    + CREDENTIAL_HINT,
    "403": "access denied; " + CREDENTIAL_HINT,
    "InvalidAccessKeyId": "the access key is not known to the store; " + CREDENTIAL_HINT,
    "SignatureDoesNotMatch": "the secret key does not match the access key; " + CREDENTIAL_HINT,
    "ExpiredToken": "the session token has expired; refresh the credentials",
    "NoSuchBucket": "the bucket does not exist; check the URL (and --endpoint-url for S3-compatible stores)",
}


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def describe_storage_error(exc: BaseException) -> str | None:
    """``what failed: what to fix`` for a storage failure anywhere in ``exc``'s chain, else None."""
    for err in _chain(exc):
        name = type(err).__name__
        if name in _BY_NAME:
            return f"{name}: {_BY_NAME[name]}"
        code = _error_code(err)
        if code in _BY_CODE:
            return f"{code}: {_BY_CODE[code]}"
        if isinstance(err, PermissionError):
            return f"permission denied ({err}); " + CREDENTIAL_HINT
    return None


_STORAGE_MODULES = ("botocore", "aiobotocore", "aiohttp", "s3fs", "fsspec", "urllib3", "gcsfs", "adlfs")


def storage_problem(exc: BaseException) -> str | None:
    """One line for an error of the storage layer that ``describe_storage_error`` does not name (endpoint
    down, DNS), or None when ``exc`` is something else (a bug, which should keep its traceback)."""
    module = type(exc).__module__.split(".")[0]
    if module in _STORAGE_MODULES or isinstance(exc, (ConnectionError, TimeoutError)):
        return f"storage cannot be reached or read ({type(exc).__name__}: {exc}); {REACH_HINT}"
    return None


def _error_code(err: BaseException) -> str | None:
    response = getattr(err, "response", None)
    if isinstance(response, dict):
        code = (response.get("Error") or {}).get("Code")
        return str(code) if code is not None else None
    return None


RESUME_HINT = (
    "once that is fixed, run the same command again to resume: committed shards are kept and not "
    "generated again"
)
# Errors of a store that is briefly away or stalled (not a wrong setting): the run can be resumed.
_TRANSIENT_NAMES = {
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ConnectionClosedError",
    "ClientConnectorError",
    "ServerDisconnectedError",
    "ServerTimeoutError",
    "FSTimeoutError",
    "ResponseStreamingError",
}


def transient_problem(exc: BaseException) -> str | None:
    """What went wrong, for a failure the same command can resume from once it passes: the disk full or
    read-only (ENOSPC, EDQUOT, EROFS), the store unreachable or not answering (connection refused,
    timeouts). None for anything else (a wrong setting, a bug)."""
    for err in _chain(exc):
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            what = (
                "no space left on the device" if err.errno != errno.EROFS else "the file system is read-only"
            )
            where = f" (writing {err.filename})" if err.filename else ""
            return f"{what}{where}"
        if type(err).__name__ in _TRANSIENT_NAMES or isinstance(err, (ConnectionError, TimeoutError)):
            return (
                f"the store cannot be reached or does not answer ({type(err).__name__}: {err}); {REACH_HINT}"
            )
    return None
