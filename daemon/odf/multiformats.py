"""Multiformats as Open Data Fabric uses them (seed 002, "Hash Representation"): a multihash is the varint of
the algorithm's multicodec, the varint of the digest's length, then the digest; its text form is multibase
base16 (`f` + lower-case hex), which is also how blocks, data files and checkpoints are named. A dataset id is
`did:odf:` + multibase(varint(ed25519-pub) + the 32-byte public key)."""

from __future__ import annotations

import hashlib
from typing import BinaryIO

SHA3_256 = 0x16
ARROW0_SHA3_256 = 0x300016  # ODF's private-use code: arrow-digest over the records (the logical hash)
ODF_METADATA_BLOCK = 0x400000  # the Manifest kind of a metadata block
ED25519_PUB = 0xED
DID_PREFIX = "did:odf:"
_CHUNK = 1 << 20


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def read_varint(data: bytes, pos: int = 0) -> tuple[int, int]:
    """The varint at `pos` and the position after it."""
    value = shift = 0
    for i in range(pos, min(len(data), pos + 9)):
        value |= (data[i] & 0x7F) << shift
        if not data[i] & 0x80:
            return value, i + 1
        shift += 7
    raise ValueError("not a varint")


def multihash(code: int, digest: bytes) -> bytes:
    return varint(code) + varint(len(digest)) + digest


def sha3(data: bytes) -> bytes:
    """The SHA3-256 multihash of `data` (blocks, and the physical hash of data files and checkpoints)."""
    return multihash(SHA3_256, hashlib.sha3_256(data).digest())


def sha3_of_file(file: BinaryIO) -> tuple[bytes, int]:
    """The physical hash of a file, streamed, and its size."""
    hasher, size = hashlib.sha3_256(), 0
    while chunk := file.read(_CHUNK):
        hasher.update(chunk)
        size += len(chunk)
    return multihash(SHA3_256, hasher.digest()), size


def split(value: bytes) -> tuple[int, bytes]:
    """A multihash's code and digest; a malformed one (a length that does not match) is a ValueError."""
    code, pos = read_varint(value)
    length, pos = read_varint(value, pos)
    if len(value) - pos != length:
        raise ValueError(f"multihash of {len(value)} bytes says its digest has {length}")
    return code, value[pos:]


def to_text(value: bytes) -> str:
    """Multibase base16, ODF's preferred encoding: the names of blocks, data files and checkpoints."""
    return "f" + value.hex()


def from_text(text: str) -> bytes:
    """Multibase base16 (`f`/`F`) back to bytes; other bases are not used by lakefeed's datasets."""
    if not text or text[0] not in "fF":
        raise ValueError(f"{text[:20]!r} is not base16 multibase (it must start with 'f')")
    return bytes.fromhex(text[1:])


def dataset_id(public_key: bytes) -> bytes:
    """The binary dataset id of an ed25519 public key (what the Seed block carries)."""
    if len(public_key) != 32:
        raise ValueError("an ed25519 public key has 32 bytes")
    return varint(ED25519_PUB) + public_key


def did(dataset_id_bytes: bytes) -> str:
    return DID_PREFIX + to_text(dataset_id_bytes)
