"""Pinned keys: every node's X25519 key made before the run, and every client's public key handed to every node.

The server relays the public keys the pair seeds of CafCor's correlated noise are agreed with. A server that put
its own key in place of a node's would agree on that node's pair seeds and could remove the correlated noise. With
``trustfl deploy keys`` an operator makes each node's key pair beforehand and gives each node its private key
(node config ``key-file``) and the public keys of all (``public-keys``), over a channel the server does not control:
a node then refuses any request whose relayed keys are not the pinned ones.

Files: ``node<k>.key`` holds client k's 32-byte private key in hex (owner-only); ``public_keys.toml`` maps each
client id to its public key in hex, under ``[public_keys]``.
"""
from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

from trustfl.core.runfiles import check_out_dir
from trustfl.errors import ConfigError, UsageError
from trustfl.privacy.keys import KEY_BYTES, ClientKeys, PublicKeyDirectory

PUBLIC_FILE = "public_keys.toml"


def key_file(directory: Path, client_id: int) -> Path:
    return Path(directory) / f"node{client_id}.key"


MAX_NODES = 100_000
"""Most nodes ``trustfl deploy keys`` makes keys for: each is a process of a real deployment with a key file of its
own (10⁸ ran for minutes without a word and would have written 10⁸ files)."""


def write_keys(out: str | os.PathLike[str], num_clients: int) -> Path:
    """Make ``num_clients`` key pairs (from the OS) into ``out``: ``node<k>.key`` (owner-only) and
    ``public_keys.toml``. Never over existing keys.

    Raises:
      UsageError: ``num_clients`` is not a positive integer, or ``out`` already holds keys.
    """
    if isinstance(num_clients, bool) or not isinstance(num_clients, int) or not 1 <= num_clients <= MAX_NODES:
        raise UsageError(f"--clients must be an integer from 1 to {MAX_NODES:,} (one key file per deployed node), "
                         f"found {num_clients!r}.")
    return save_keys(out, [ClientKeys.generate(k) for k in range(num_clients)])


def save_keys(out: str | os.PathLike[str], keys: list[ClientKeys]) -> Path:
    """Write ``keys`` into ``out`` as :func:`write_keys` does (UsageError if ``out`` already holds keys)."""
    import tomli_w

    out = check_out_dir(out)
    held = sorted(p.name for p in out.glob("node*.key")) + ([PUBLIC_FILE] if (out / PUBLIC_FILE).exists() else [])
    if held:
        shown = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
        raise UsageError(f"--out {str(out)!r} already holds keys ({shown}): a node's key is never written over; "
                         f"choose another directory.")
    try:
        out.mkdir(parents=True, exist_ok=True)
        for k in keys:
            fd = os.open(key_file(out, k.client_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(k.private_key.private_bytes_raw().hex() + "\n")
        public = {str(k.client_id): k.public_bytes.hex() for k in keys}
        (out / PUBLIC_FILE).write_text(tomli_w.dumps({"public_keys": public}))
    except OSError as err:
        raise UsageError(f"--out: cannot write the keys into {str(out)!r}: {err.strerror or err}.") from None
    return out


def _hex_key(text: str, what: str) -> bytes:
    if not re.fullmatch(rf"[0-9a-f]{{{2 * KEY_BYTES}}}", text):
        raise ConfigError(f"{what} must be {KEY_BYTES} bytes in hex ({2 * KEY_BYTES} digits 0-9a-f).")
    return bytes.fromhex(text)


def read_private_key(path: str | os.PathLike[str], client_id: int) -> ClientKeys:
    """Client ``client_id``'s key pair from its ``key-file``.

    Raises:
      ConfigError: the file cannot be read or does not hold one key (the node config key and file are named).
    """
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    try:
        text = Path(path).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"node config `key-file`: {str(path)!r} cannot be read ({type(err).__name__}).") from None
    raw = _hex_key(text, f"node config `key-file`: {str(path)!r}")
    return ClientKeys(client_id, X25519PrivateKey.from_private_bytes(raw))


def read_public_keys(path: str | os.PathLike[str]) -> PublicKeyDirectory:
    """The pinned public keys from a ``public-keys`` file.

    Raises:
      ConfigError: the file cannot be read or is not a ``[public_keys]`` table of ids to hex keys.
    """
    where = f"node config `public-keys`: {str(path)!r}"
    try:
        table = tomllib.loads(Path(path).read_text(encoding="utf-8")).get("public_keys")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"{where} cannot be read ({type(err).__name__}).") from None
    if not isinstance(table, dict) or not table:
        raise ConfigError(f"{where} holds no [public_keys] table of client ids to keys.")
    keys = {}
    for cid, key in table.items():
        if not re.fullmatch(r"\d{1,18}", cid) or not isinstance(key, str):
            raise ConfigError(f"{where}: entry {cid!r} must map a client id to a key in hex.")
        keys[int(cid)] = _hex_key(key, f"{where}: the key of client {cid}")
    return PublicKeyDirectory.of(keys)
