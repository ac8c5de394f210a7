"""The version check shared by the callbacks' checkpointed state (STYLE rule 8)."""

from __future__ import annotations

from typing import Any

from lightning_scale.errors import ConfigurationError

STATE_VERSION = 1


def check_state_version(state_dict: dict[str, Any], owner: str, missing: int | None = STATE_VERSION) -> None:
    """Raise ``ValueError`` naming the fix unless ``state_dict`` has the version this release reads.

    ``missing`` is the version assumed when the state has none (``None``: a missing version is refused too).
    """
    version = state_dict.get("version", missing)
    if version != STATE_VERSION:
        raise ConfigurationError(
            f"{owner} state has version {version!r}; this lightning-scale reads version {STATE_VERSION}. Resume with "
            "the lightning-scale release that wrote the checkpoint."
        )
