"""Who signs a trail's heads: an Ed25519 key kept outside the state dir, its public half in the run.

The private key is ``<anchor dir>/trail.ed25519`` (32 raw bytes, mode 0600, made on first use);
``trail.ed25519.pub`` beside it holds ``{"public_key", "holder"}`` (the holder is user@host at
creation). A run records that public record in its genesis event, so anyone holding the trail
verifies its heads; only the key holder can sign them. Runs made before Ed25519 carry no signer
and keep the legacy HMAC under ``trail.key`` (verifying those needs that secret).

Signing and verifying go through libsodium (PyNaCl's bindings): every write signs its head, and
libsodium signs in about 60% of the time OpenSSL takes here and verifies in about half (Ed25519 is
deterministic, so both give the same bytes; the tests check ours with ``cryptography``'s OpenSSL).
PyNaCl is imported only when a key is used, never on the read path.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterator

PRIVATE_NAME = "trail.ed25519"
PUBLIC_NAME = "trail.ed25519.pub"
LEGACY_KEY_NAME = "trail.key"
KEY_BYTES = 32


class AnchorError(Exception):
    """A key or a signed head is missing, malformed, or does not verify."""


_READ_FROM: list[tuple[Path, Path]] = []
"""(anchor dir, heads dir) an audit reads from instead (``audit --anchor-dir DIR``), innermost last."""


def anchor_dir() -> Path:
    if _READ_FROM:
        return _READ_FROM[-1][0]
    override = os.environ.get("ORCHESTRATOR_ANCHOR_DIR")
    if override:
        return Path(override)
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "orchestrator"


def heads_dir() -> Path:
    """Where the signed heads are: ``<anchor dir>/heads``, or the folder an audit was pointed at."""
    return _READ_FROM[-1][1] if _READ_FROM else anchor_dir() / "heads"


@contextlib.contextmanager
def reading_from(folder: Path) -> Iterator[None]:
    """Read keys and heads from ``folder`` (a folder holding ``heads/``, or the heads folder itself) inside the block.

    Only reading: the writer's key and heads stay where ``anchor_dir`` says outside it.
    """
    heads = folder / "heads" if (folder / "heads").is_dir() else folder
    _READ_FROM.append((folder, heads))
    try:
        yield
    finally:
        _READ_FROM.pop()


def key_id(public_key: str) -> str:
    return hashlib.sha256(bytes.fromhex(public_key)).hexdigest()[:16]


def describe(signer: dict[str, Any]) -> str:
    """``ed25519 key <fingerprint> of <holder>``: the fingerprint is ``key_id``, the first 16 hex digits of the
    sha256 of the 32 raw public key bytes."""
    return f"ed25519 key {key_id(signer['public_key'])} of {signer.get('holder') or 'an unnamed holder'}"


def own_signer(*, create: bool) -> dict[str, Any] | None:
    """This anchor dir's public record ``{algorithm, public_key, holder}``; made with the key when ``create``."""
    public = anchor_dir() / PUBLIC_NAME
    if public.exists():
        return _read_public(public)
    if not create:
        return None
    _private_key(create=True)
    return _read_public(public)


def _read_public(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text())
        bytes.fromhex(record["public_key"])
        return {"algorithm": "ed25519", "public_key": record["public_key"], "holder": str(record.get("holder", ""))}
    except (OSError, ValueError, KeyError, TypeError):
        raise AnchorError(f"{path} is not a public key record") from None


class SigningKey:
    """An Ed25519 private key: ``sign(body)`` is the 64-byte detached signature."""

    __slots__ = ("public_key", "_secret", "_sign")

    def __init__(self, seed: bytes) -> None:
        from nacl.bindings import crypto_sign, crypto_sign_seed_keypair

        public, self._secret = crypto_sign_seed_keypair(seed)
        self.public_key = public.hex()
        self._sign = crypto_sign

    def sign(self, body: bytes) -> bytes:
        return self._sign(body, self._secret)[:64]  # libsodium returns the signature, then the message


_PRIVATE: dict[Path, SigningKey] = {}


def _private_key(*, create: bool) -> SigningKey:
    path = anchor_dir() / PRIVATE_NAME
    if path in _PRIVATE:
        return _PRIVATE[path]
    raw = _read_or_make(path, create=create)
    if raw is None:
        raise AnchorError(f"no signing key at {path}: only the key's holder can write this run")
    key = SigningKey(raw)
    public = anchor_dir() / PUBLIC_NAME
    if not public.exists():
        import getpass
        import socket

        holder = f"{getpass.getuser()}@{socket.gethostname()}"
        _write_exclusive(public, json.dumps({"public_key": key.public_key, "holder": holder}).encode(), mode=0o644)
    _PRIVATE[path] = key
    return key


def _read_or_make(path: Path, *, create: bool) -> bytes | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        if not create:
            return None
        _write_exclusive(path, os.urandom(KEY_BYTES), mode=0o600)
        raw = path.read_bytes()
    if len(raw) != KEY_BYTES:
        raise AnchorError(f"{path} is not a {KEY_BYTES}-byte key")
    return raw


def _write_exclusive(path: Path, content: bytes, *, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:  # another process made it first
        return
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())


def sign(body: bytes) -> str:
    return _private_key(create=True).sign(body).hex()


def signing_key() -> SigningKey:
    """This anchor dir's Ed25519 private key (made on first use), loaded once per process: a writer
    keeps it and calls its ``sign`` for every head."""
    return _private_key(create=True)


def verify(public_key: str, signature: str, body: bytes) -> bool:
    from nacl.bindings import crypto_sign_open
    from nacl.exceptions import CryptoError

    try:
        public, sig = bytes.fromhex(public_key), bytes.fromhex(signature)
        if len(sig) != 64:
            return False
        crypto_sign_open(sig + body, public)
    except (CryptoError, ValueError, TypeError):
        return False
    return True


def legacy_key(*, create: bool = False) -> bytes | None:
    """The HMAC secret ``trail.key`` of runs made before Ed25519; None when there is none."""
    return _read_or_make(anchor_dir() / LEGACY_KEY_NAME, create=create)


def legacy_mac(body: bytes, *, create: bool = False) -> str | None:
    """HMAC-SHA256 under ``trail.key`` (runs made before Ed25519); None when there is no key."""
    import hmac

    key = legacy_key(create=create)
    return None if key is None else hmac.new(key, body, hashlib.sha256).hexdigest()
