"""API keys: minting, hashing, the Authorization header, and looking keys up."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from hardcap_core import auth
from hardcap_core.auth import KeyIndex, bearer_token, hash_key, keys_new_command, new_key
from hardcap_core.config import load_config, parse_config
from hardcap_core.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DEMO_CONFIG = Path(__file__).resolve().parents[2] / "hardcap_core" / "local" / "demo.yaml"
HASH_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def test_new_key_shape_and_hash() -> None:
    key, key_hash = new_key()
    assert re.fullmatch(r"hc_[A-Za-z0-9_\-]{43}", key)
    assert HASH_RE.match(key_hash)
    assert key_hash == hash_key(key)
    assert key not in key_hash
    assert key[3:] not in key_hash


def test_new_keys_differ() -> None:
    keys = {new_key()[0] for _ in range(100)}
    assert len(keys) == 100


def test_hash_is_stable_and_never_the_plaintext() -> None:
    assert hash_key("sk-alpha-demo") == hash_key("sk-alpha-demo")
    assert hash_key("sk-alpha-demo") != hash_key("sk-alpha-demo ")
    for key in ("sk-alpha-demo", "", "x", "sha256:" + "0" * 64):
        assert hash_key(key) != key
        assert HASH_RE.match(hash_key(key))


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("Bearer sk-a", "sk-a"),
        ("bearer sk-a", "sk-a"),
        ("BEARER   sk-a  ", "sk-a"),
        ("Bearer", None),
        ("Bearer ", None),
        ("Basic dXNlcjpwYXNz", None),
        ("sk-a", None),
        ("Bearer sk-a extra", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_token(header: str | None, expected: str | None) -> None:
    assert bearer_token(header) == expected


def test_index_finds_good_keys_only() -> None:
    index = KeyIndex({hash_key("sk-a"): "alice", hash_key("sk-b"): "bob"})
    assert len(index) == 2
    assert index.lookup("sk-a") == "alice"
    assert index.lookup("sk-b") == "bob"
    assert index.lookup("sk-c") is None
    assert index.lookup("") is None
    assert index.lookup(hash_key("sk-a")) is None  # the stored hash is not a key
    assert index.lookup("sk-a" + "x" * auth.MAX_KEY_LENGTH) is None


def test_index_refuses_anything_but_hashes() -> None:
    with pytest.raises(ValueError, match="not a key hash"):
        KeyIndex({"sk-a": "alice"})


def test_a_dict_hit_with_a_different_stored_hash_is_refused() -> None:
    # Plant an entry under the presented key's hash whose stored hash differs, as a hash
    # collision in the dict would: the final comparison of full hashes must still refuse it.
    index = KeyIndex({hash_key("sk-a"): "alice"})
    index._entries[hash_key("sk-mallory")] = (hash_key("sk-a"), "alice")
    assert index.lookup("sk-mallory") is None
    assert index.lookup("sk-a") == "alice"


def test_config_authenticate() -> None:
    config = load_config(DEMO_CONFIG)
    principal = config.authenticate("sk-alpha-demo")
    assert principal is not None
    assert (principal.key_id, principal.tenant_id) == ("alpha-dev", "alpha")
    assert config.authenticate("sk-alpha-demo-") is None
    assert config.authenticate("") is None
    assert (
        config.authenticate(
            "sha256:684455aba2f4e49856693f862d62ed1756ea87a33e1d4340560fe704c7eee471"
        )
        is None
    )


def test_local_example_comments_hold_the_matching_demo_keys() -> None:
    pairs = re.findall(
        r'hash: "(sha256:[0-9a-f]{64})"\s+# (\S+)', (DEMO_CONFIG).read_text()
    )
    assert len(pairs) == 4
    for stored, plaintext in pairs:
        assert hash_key(plaintext) == stored


def test_keys_new_command_round_trips_into_a_config() -> None:
    text = keys_new_command("alpha", "alpha-ci")
    key = re.search(r"^  (hc_\S+)$", text, re.MULTILINE)
    assert key is not None
    snippet = text[text.index("      - id:") :]
    entry = yaml.safe_load(snippet)[0]
    assert entry == {"id": "alpha-ci", "hash": hash_key(key.group(1))}
    assert text.count(key.group(1)) == 1  # the plaintext is printed once
    config = parse_config({"tenants": [{"id": "alpha", "keys": [entry]}]}, environ={})
    principal = config.authenticate(key.group(1))
    assert principal is not None
    assert (principal.tenant_id, principal.key_id) == ("alpha", "alpha-ci")


def test_keys_new_command_makes_up_an_id() -> None:
    text = keys_new_command("alpha", None)
    assert re.search(r"- id: alpha-[0-9a-f]{6}\n", text)
    assert re.search(r"- id: key-[0-9a-f]{6}\n", keys_new_command(None, None))


@pytest.mark.parametrize(("tenant", "key_id"), [("bad tenant", None), ("alpha", "a/b")])
def test_keys_new_command_checks_ids(tenant: str, key_id: str | None) -> None:
    with pytest.raises(ConfigError, match="must match"):
        keys_new_command(tenant, key_id)
