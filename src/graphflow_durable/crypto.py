"""Encryption at rest: the codec a store seals its content columns with, and its keys.

``Store(url, codec=AESGCMCodec(Keys.from_env()))`` seals every message body, agent state, task,
result, call record, prompt and answer it writes (see docs/encryption.md for what is sealed and
what stays plain). A codec only turns bytes into bytes under a named key; *where* a sealed value
belongs (its table, run, position and column) is bound in by the store as the associated data, so
a ciphertext moved to another row fails to open.

The built-in codec is AES-256-GCM through the ``cryptography`` package (the ``crypto`` extra),
imported when a codec is built: a store without a codec never needs it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from graphflow_durable.errors import StoreConfigError

__all__ = ["AESGCMCodec", "Codec", "Keys", "KEY_ID", "OpenFailed"]

#: What a key id may look like: it is stored in front of every sealed value, in plain.
KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
KEY_BYTES = 32
NONCE_BYTES = 12
_CHECK_LABEL = b"graphflow-durable key check v1"


class OpenFailed(Exception):
    """A sealed value did not open under its key: tampered, truncated, moved, or the wrong key.

    Raised by :meth:`Codec.open`; the store turns it into a :class:`~graphflow_durable.errors.StoreCorruptError`
    naming the row (or a :class:`~graphflow_durable.errors.StoreConfigError` when the key check
    value shows the key itself is not the one the store was sealed with).
    """


@runtime_checkable
class Codec(Protocol):
    """Seals and opens bytes under named keys (AES-256-GCM: :class:`AESGCMCodec`).

    ``active`` is the key id new values are sealed with. ``open`` raises :class:`OpenFailed`
    when the value does not authenticate, and ``StoreConfigError`` naming the key id when the
    codec holds no key of that id. ``check_value`` is a short, non-secret digest of a key that
    the store keeps beside its rows, to tell a wrong key from a damaged row.
    """

    @property
    def active(self) -> str: ...

    def seal(self, key_id: str, plaintext: bytes, aad: bytes) -> bytes: ...

    def open(self, key_id: str, sealed: bytes, aad: bytes) -> bytes: ...

    def has_key(self, key_id: str) -> bool: ...

    def check_value(self, key_id: str) -> str: ...


class Keys:
    """Named 32-byte keys, and which one new rows are sealed with.

    Build it from a mapping (``Keys({"k1": key_bytes}, active="k1")``), from the environment
    (:meth:`from_env`), or from a callable ``key_id -> bytes`` (a KMS lookup; ``active`` is then
    required). Key material never appears in a ``repr`` or an error message.
    """

    def __init__(
        self,
        keys: Mapping[str, bytes] | Callable[[str], bytes],
        *,
        active: str | None = None,
    ) -> None:
        if callable(keys):
            if active is None:
                raise StoreConfigError(
                    "Keys(lookup): pass active='KEY_ID', the key new rows are sealed with", option="active"
                )
            self._lookup: Callable[[str], bytes] | None = keys
            self._keys: dict[str, bytes] = {}
        else:
            if not keys:
                raise StoreConfigError(
                    "Keys: no key given; pass at least one 'key_id': 32 bytes", option="keys"
                )
            self._lookup = None
            self._keys = {}
            for key_id, material in keys.items():
                self._keys[_key_id(key_id)] = _material(key_id, material)
            active = list(self._keys)[-1] if active is None else active
            if active not in self._keys:
                raise StoreConfigError(
                    f"Keys: the active key {active!r} is not among the keys given ({', '.join(self._keys)})",
                    option="active",
                )
        self.active = _key_id(active)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Keys:
        """The keys in ``GRAPHFLOW_DURABLE_KEYS`` (``"k1=<base64 of 32 bytes>,k2=..."``).

        The active key is ``GRAPHFLOW_DURABLE_ACTIVE_KEY`` if set, else the last one listed.
        A malformed value (not ``id=base64``, not 32 bytes, a duplicate id) raises
        :class:`~graphflow_durable.errors.StoreConfigError` naming the key id, never its material.
        """
        env = os.environ if environ is None else environ
        text = env.get("GRAPHFLOW_DURABLE_KEYS", "").strip()
        if not text:
            raise StoreConfigError(
                "GRAPHFLOW_DURABLE_KEYS is not set: set it to 'KEY_ID=<base64 of 32 random bytes>[,...]'",
                option="GRAPHFLOW_DURABLE_KEYS",
            )
        keys: dict[str, bytes] = {}
        for position, item in enumerate(text.split(","), 1):
            key_id, sep, encoded = item.strip().partition("=")
            key_id = key_id.strip()
            # A key pasted without its id ("<base64>=") parses as an id with nothing after "=":
            # such an item, or an id that is not one, is named by its position, never echoed.
            if not sep or not key_id or not encoded.strip() or not KEY_ID.fullmatch(key_id):
                raise StoreConfigError(
                    f"GRAPHFLOW_DURABLE_KEYS: item {position} is not 'KEY_ID=<base64 of 32 bytes>' "
                    "(a key id is 1-64 of letters, digits, '_', '.', '-')",
                    option="GRAPHFLOW_DURABLE_KEYS",
                )
            if key_id in keys:
                raise StoreConfigError(
                    f"GRAPHFLOW_DURABLE_KEYS: key id {key_id!r} is listed twice; give each key one id",
                    option="GRAPHFLOW_DURABLE_KEYS",
                )
            try:
                material = base64.b64decode(encoded.strip(), validate=True)
            except (binascii.Error, ValueError):
                raise StoreConfigError(
                    f"GRAPHFLOW_DURABLE_KEYS: key {key_id!r} is not valid base64",
                    option="GRAPHFLOW_DURABLE_KEYS",
                ) from None
            keys[key_id] = _material(key_id, material)
        active = env.get("GRAPHFLOW_DURABLE_ACTIVE_KEY", "").strip() or None
        return cls(keys, active=active)

    def get(self, key_id: str) -> bytes | None:
        """The key of this id, or ``None`` when there is none."""
        if self._lookup is None:
            return self._keys.get(key_id)
        try:
            material = self._lookup(key_id)
        except KeyError:
            return None
        return _material(key_id, material)

    def __repr__(self) -> str:
        held = "lookup" if self._lookup is not None else ", ".join(self._keys)
        return f"Keys({held}; active={self.active!r})"


class AESGCMCodec:
    """AES-256-GCM under named keys: a fresh 96-bit random nonce per value, a 128-bit tag.

    ``AESGCMCodec(Keys.from_env())``, or ``AESGCMCodec({"k1": key}, active="k1")``. Needs the
    ``cryptography`` package (``pip install 'graphflow-durable[crypto]'``).
    """

    def __init__(
        self, keys: Keys | Mapping[str, bytes] | Callable[[str], bytes], *, active: str | None = None
    ) -> None:
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError:
            raise StoreConfigError(
                "encryption at rest needs the cryptography package: pip install 'graphflow-durable[crypto]'",
                option="codec",
            ) from None
        self._aead = AESGCM
        if not isinstance(keys, Keys):
            keys = Keys(keys, active=active)
        elif active is not None and active != keys.active:
            if keys.get(active) is None:
                raise StoreConfigError(
                    f"AESGCMCodec: no key {active!r} among the keys given", option="active"
                )
            keys.active = active
        self.keys = keys
        self._ciphers: dict[str, object] = {}

    @property
    def active(self) -> str:
        return self.keys.active

    def _cipher(self, key_id: str):  # type: ignore[no-untyped-def]  # cryptography's AESGCM
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            material = self.keys.get(key_id)
            if material is None:
                raise StoreConfigError(
                    f"no key {key_id!r} among the store's keys: add it to GRAPHFLOW_DURABLE_KEYS "
                    f"(or the codec's keys) to open rows sealed with it",
                    option="codec",
                )
            cipher = self._ciphers[key_id] = self._aead(material)
        return cipher

    def seal(self, key_id: str, plaintext: bytes, aad: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        sealed: bytes = self._cipher(key_id).encrypt(nonce, plaintext, aad)
        return nonce + sealed

    def open(self, key_id: str, sealed: bytes, aad: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag

        cipher = self._cipher(key_id)
        if len(sealed) < NONCE_BYTES + 16:
            raise OpenFailed("truncated")
        try:
            opened: bytes = cipher.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], aad)
        except InvalidTag:
            raise OpenFailed("does not authenticate") from None
        return opened

    def has_key(self, key_id: str) -> bool:
        return self.keys.get(key_id) is not None

    def check_value(self, key_id: str) -> str:
        material = self.keys.get(key_id)
        if material is None:
            raise StoreConfigError(f"no key {key_id!r} among the store's keys", option="codec")
        return hmac.new(material, _CHECK_LABEL, hashlib.sha256).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"AESGCMCodec({self.keys!r})"


def _key_id(key_id: str) -> str:
    if not isinstance(key_id, str) or not KEY_ID.fullmatch(key_id):
        raise StoreConfigError(
            f"key id {str(key_id)[:64]!r} is not 1-64 of letters, digits, '_', '.', '-'",
            option="keys",
        )
    return key_id


def _material(key_id: str, material: bytes) -> bytes:
    if not isinstance(material, (bytes, bytearray)) or len(material) != KEY_BYTES:
        size = len(material) if isinstance(material, (bytes, bytearray)) else type(material).__name__
        raise StoreConfigError(
            f"key {key_id!r} is {size} bytes, not {KEY_BYTES}: generate one with "
            f'python -c "import os, base64; print(base64.b64encode(os.urandom(32)).decode())"',
            option="keys",
        )
    return bytes(material)
