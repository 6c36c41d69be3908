"""The public key an auditor pins, and what a signed log proves with and without one.

A run's genesis names the key that signs its heads, and every signature is checked under that key: so a
log someone re-hashed under a genesis naming their own key, and signed with it, is as consistent as the
original. Only a key the auditor got from the signer by a way they trust tells the two apart. ``audit``
takes it from ``--key FILE|HEX``, else ``ORCHESTRATOR_TRUSTED_KEY`` (the same), else the anchor dir's
``trail.ed25519.pub`` (this machine's own key, or the one in the folder ``--anchor-dir`` names); without
one it says what the signatures then prove and does not call the trail intact. A key is a
``trail.ed25519.pub`` record (``{"public_key": hex, "holder"}``, what ``orchestrator key --export`` writes)
or the 64 hex digits of the raw public key, in a file or given as is.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.trail import signing
from orchestrator.trail.findings import Finding

TRUSTED_KEY_ENV = "ORCHESTRATOR_TRUSTED_KEY"
_HEX_KEY = re.compile(r"[0-9a-fA-F]{64}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Pin:
    public_key: str
    holder: str
    source: str
    """Where the auditor's key came from, in words ("--key FILE", the variable, the anchor dir's .pub)."""

    def describe(self) -> str:
        return f"{signing.describe({'public_key': self.public_key, 'holder': self.holder})}, pinned by {self.source}"


def pinned_key(option: str | None) -> Pin | None:
    """The key an audit checks the run's signer against; AnchorError when the one given cannot be read."""
    if option:
        return read_key(option, source=f"--key {option}")
    given = os.environ.get(TRUSTED_KEY_ENV, "").strip()
    if given:
        return read_key(given, source=f"{TRUSTED_KEY_ENV}={given}")
    public = signing.anchor_dir() / signing.PUBLIC_NAME
    if not public.exists():
        return None
    own = signing.own_signer(create=False)
    assert own is not None
    return Pin(public_key=own["public_key"], holder=own["holder"], source=f"{public} (in the anchor dir)")


def read_key(value: str, *, source: str) -> Pin:
    """A key given as 64 hex digits, or a file holding a ``.pub`` record or those digits."""
    if _HEX_KEY.fullmatch(value.strip()):
        return Pin(public_key=value.strip().lower(), holder="", source=source)
    try:
        text = Path(value).expanduser().read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise signing.AnchorError(f"cannot read the pinned key {value}: {getattr(exc, 'strerror', None) or exc}"
                                  ) from None
    if _HEX_KEY.fullmatch(text):
        return Pin(public_key=text.lower(), holder="", source=source)
    try:
        record = json.loads(text)
        key = str(record["public_key"])
        if not _HEX_KEY.fullmatch(key):
            raise ValueError(key)
    except (ValueError, KeyError, TypeError):
        raise signing.AnchorError(f"{value} holds no Ed25519 public key (a trail.ed25519.pub record from "
                                  "`orchestrator key --export`, or 64 hex digits)") from None
    return Pin(public_key=key.lower(), holder=str(record.get("holder") or ""), source=source)


def key_finding(signer: dict[str, Any] | None, pin: Pin | None) -> Finding | None:
    """What the pin says of a run's signer: nothing when they agree (or the run is legacy HMAC), else a finding."""
    if signer is None:
        return None
    named = f"{signing.describe(signer)}, public key {signer['public_key']}"
    if pin is None:
        return Finding(seq=0, check="key", message=(
            f"no public key pinned: the signatures show only that the log is consistent with the key it names "
            f"({named}), which anyone can make for a log they wrote; pin the signer's key with --key FILE or "
            f"{TRUSTED_KEY_ENV} to check that it is theirs"))
    if pin.public_key != signer["public_key"].lower():
        return Finding(seq=0, check="key", message=(
            f"the run's genesis names {named}, but the key pinned by {pin.source} is "
            f"ed25519 key {signing.key_id(pin.public_key)}: the log was not signed by the pinned key (re-signed "
            "under another key, or the wrong key was pinned)"))
    return None
