"""How to read the results, as a line a user can paste: the polars call with the storage options it needs.

fsspec/s3fs options (what prefixflow takes) and object_store options (what polars takes) are spelled
differently; secrets are never echoed, only their keys with a placeholder."""

from __future__ import annotations

from typing import Any

from prefixflow.pipeline.job.config import StorageConfig

_SECRET = "<from your AWS environment>"
_RENAMED = {"key": "aws_access_key_id", "secret": "aws_secret_access_key", "token": "aws_session_token"}


def polars_storage_options(url: str, storage: StorageConfig | None) -> dict[str, Any]:
    """The ``storage_options`` polars needs for ``url`` (empty for local paths)."""
    if not url.startswith(("s3://", "s3a://")) or storage is None:
        return {}
    out: dict[str, Any] = {}
    client = dict(storage.options.get("client_kwargs") or {})
    endpoint = storage.endpoint_url or client.get("endpoint_url")
    if endpoint:
        out["aws_endpoint_url"] = endpoint
        if str(endpoint).startswith("http://"):
            out["aws_allow_http"] = "true"
    if client.get("region_name"):
        out["aws_region"] = client["region_name"]
    for ours, theirs in _RENAMED.items():
        if storage.options.get(ours):
            out[theirs] = _SECRET
    if storage.options.get("anon") in (True, "true", "True"):
        out["aws_skip_signature"] = "true"
    return out


def polars_hint(glob: str, storage: StorageConfig | None = None) -> str:
    options = polars_storage_options(glob, storage)
    extra = f", storage_options={options!r}" if options else ""
    return f"polars.scan_parquet({glob!r}{extra})"
