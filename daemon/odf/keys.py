"""The entity's ed25519 key pair, made once and kept in its state folder (`odf-ed25519.key`, owner-only): the
public key is the dataset's `did:odf:` identity (the Seed block); the private key is what would sign for it."""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

KEY_FILE = "odf-ed25519.key"


def public_key(state: Path) -> bytes:
    """The 32-byte public key, the key pair made (and kept) first if there is none."""
    path = Path(state) / KEY_FILE
    try:
        private = Ed25519PrivateKey.from_private_bytes(path.read_bytes())
    except FileNotFoundError:
        private = Ed25519PrivateKey.generate()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(private.private_bytes_raw())
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    return private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
