"""Storage credentials for flow runs, kept out of Prefect's database.

Flow parameters are stored by the Prefect API in plain text (and shown in the UI), so the
batch_inference flow refuses storage options that look like credentials. A run gets its credentials
from where the process already has them (the environment, an AWS profile, an instance or pod role:
s3fs follows the standard AWS credential chain), or from a Prefect block named by the
``credentials_block`` parameter: a ``Secret`` block whose value is a JSON object of fsspec storage
options (``{"key": ..., "secret": ...}``), or an ``AwsCredentials`` block of prefect-aws. The block is
loaded inside each task that touches storage, so its contents never become a parameter either.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from prefixflow.pipeline import JobConfigError, JobSpec
from prefixflow.pipeline.job.config import secret_name_pattern, secret_option_paths

REDACTED = "<redacted: credentials are never stored as flow parameters>"


def secret_parameter_paths(parameters: dict[str, Any]) -> list[str]:
    """Dotted paths of the flow parameters that look like credentials: credential-like keys anywhere in
    ``storage_options`` and in a job dict's ``storage`` (nested mappings included), and a password in
    any URL parameter (``endpoint_url``, ``input``, ``output``, ``ray_address``, a job's endpoint)."""
    found = secret_option_paths(parameters.get("storage_options") or {}, "storage_options.")
    job = parameters.get("job")
    if isinstance(job, dict):
        found += secret_option_paths(job.get("storage") or {}, "job.storage.")
    for name in ("endpoint_url", "input", "output", "ray_address"):
        found += secret_option_paths({name: parameters.get(name)})
    return found


def refuse_plain_secrets(
    storage_options: dict[str, Any] | None, endpoint_url: str | None = None, **more: Any
) -> None:
    """Raise JobConfigError naming (never showing) credential-like parameters (see
    ``secret_parameter_paths``; ``more`` are further flow parameters: ``job``, ``input``, ...), and
    saying where credentials go instead."""
    paths = secret_parameter_paths({"storage_options": storage_options, "endpoint_url": endpoint_url, **more})
    if paths:
        raise JobConfigError(
            f"parameters {', '.join(sorted(paths))} look like credentials. Prefect stores flow parameters in "
            "plain text, so the flow does not take them: give the run its credentials through the environment "
            "or the AWS credential chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, an instance "
            "role), or save them in a Prefect Secret block as a JSON object of storage options and pass "
            "credentials_block='secret/<name>' (--credentials-block)"
        )


def redact_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """The flow's parameters with credential-like storage options replaced (what reaches the API)."""
    out = dict(parameters)
    for path in secret_parameter_paths(parameters):
        top = path.split(".", 1)[0]
        if top == "job":  # the job dict stays readable; only its storage settings go
            out["job"] = {**parameters["job"], "storage": REDACTED}
        else:
            out[top] = REDACTED
    return out


def _safe_value(depth: int) -> dict[str, Any]:
    """A JSON schema for a storage option value: no URL with a password, and (while ``depth`` lasts) a
    mapping only of safe names; deeper mappings are not accepted."""
    no_password = {"not": {"type": "string", "pattern": _URL_PASSWORD}}
    nested = safe_options_schema(depth - 1) if depth > 1 else {"not": {"type": "object"}}
    return {"allOf": [no_password, {"anyOf": [{"not": {"type": "object"}}, nested]}]}


_URL_PASSWORD = "://[^/@]*@"  # user:password@host (secret_option_paths' URL rule)


def safe_options_schema(depth: int = 4) -> dict[str, Any]:
    """A mapping that cannot carry credentials: its keys (and those of nested mappings, ``depth`` levels
    deep) never look like credential names. Plain JSON schema without references, which the Prefect API
    validates deployment-run parameters against before it creates (and stores) a flow run."""
    return {
        "type": "object",
        "propertyNames": {"not": {"pattern": secret_name_pattern()}},
        "additionalProperties": _safe_value(depth),
    }


SAFE_URL_SCHEMA: dict[str, Any] = {
    "anyOf": [{"type": "null"}, {"type": "string", "not": {"pattern": _URL_PASSWORD}}]
}
SAFE_OPTIONS_SCHEMA: dict[str, Any] = {"anyOf": [{"type": "null"}, safe_options_schema()]}
SAFE_JOB_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "null"},
        {"type": "string"},
        {"type": "object", "properties": {"storage": safe_options_schema()}},
    ],
    "description": "a job YAML path or a job dict; its `storage` never holds credentials",
}


def block_options(block: str) -> dict[str, Any]:
    """fsspec storage options from the Prefect block ``block`` ("secret/NAME", "aws-credentials/NAME",
    or a bare NAME for a Secret block)."""
    from prefect.blocks.core import Block

    slug = block if "/" in block else f"secret/{block}"
    try:
        loaded = Block.load(slug)
    except Exception as exc:  # noqa: BLE001 - a missing or unreadable block: say which and why
        raise JobConfigError(
            f"credentials_block {block!r}: cannot load the Prefect block {slug!r} "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    if hasattr(loaded, "aws_access_key_id"):  # prefect-aws AwsCredentials
        options: dict[str, Any] = {
            "key": loaded.aws_access_key_id,
            "secret": _plain(loaded.aws_secret_access_key),
        }
        if getattr(loaded, "aws_session_token", None):
            options["token"] = loaded.aws_session_token
        if getattr(loaded, "region_name", None):
            options["client_kwargs"] = {"region_name": loaded.region_name}
        return options
    from fastapi.encoders import jsonable_encoder  # Prefect's own dependency

    value = loaded.get() if hasattr(loaded, "get") else None
    if not isinstance(value, dict):
        raise JobConfigError(
            f"credentials_block {block!r}: expected a Secret whose value is a JSON object of "
            'storage options, e.g. {"key": "...", "secret": "..."}'
        )
    return dict(jsonable_encoder(value))


def _plain(value: Any) -> Any:
    return value.get_secret_value() if hasattr(value, "get_secret_value") else value


def with_credentials(spec: JobSpec, block: str | None) -> JobSpec:
    """``spec`` with the block's storage options merged in (its own options win only where the block is
    silent); ``spec`` itself when no block is named."""
    if not block:
        return spec
    storage = spec.config.storage
    merged = {**storage.options, **block_options(block)}
    return replace(spec, config=spec.config.replaced(storage=storage.model_copy(update={"options": merged})))
