"""Client keys, roles and upstream identities: the credentials file and the variables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hapi.gateway import Caller, ClientKey, GatewaySettings, read_credentials_file
from hapi.gateway._errors import InvalidBucketName
from hapi.gateway._identities import backend_actors, caller_of
from hapi.gateway._operation import parse_operation
from hapi.protocol import Credentials

BACKEND = Credentials("BACKENDKEY", "backend-secret")
ENV = {
    "HAPI_BACKEND_URL": "http://127.0.0.1:1",
    "HAPI_BACKEND_ACCESS_KEY_ID": BACKEND.access_key_id,
    "HAPI_BACKEND_SECRET_ACCESS_KEY": BACKEND.secret_access_key,
}


def _file(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "credentials.json"
    path.write_text(json.dumps(data))
    return path


def test_each_key_has_a_role_and_an_upstream_identity(tmp_path: Path) -> None:
    keys = {
        "ADMIN": {"secret": "a", "role": "admin"},
        "ALICE": {"secret": "b", "upstream": "self"},
        "BOB": {
            "secret": "c",
            "upstream": {"access_key_id": "STOREBOB", "secret_access_key": "d"},
        },
    }
    clients = read_credentials_file(_file(tmp_path, {"keys": keys}))
    assert clients == {
        "ADMIN": ClientKey("a", "admin"),
        "ALICE": ClientKey("b", "client", Credentials("ALICE", "b")),
        "BOB": ClientKey("c", "client", Credentials("STOREBOB", "d")),
    }
    assert caller_of("ADMIN", clients, BACKEND) == Caller("ADMIN", "admin", BACKEND)
    assert caller_of("BOB", clients, BACKEND).upstream == Credentials("STOREBOB", "d")
    assert "'c'" not in repr(clients["BOB"]) and "'d'" not in repr(clients["BOB"])


def test_a_client_acts_as_the_backend_identity_only_when_it_says_so(tmp_path: Path) -> None:
    keys = {
        "SOLO": {"secret": "s", "upstream": "backend"},
        "ALICE": {"secret": "b", "upstream": "self"},
    }
    clients = read_credentials_file(_file(tmp_path, {"keys": keys}))
    assert clients["SOLO"] == ClientKey("s", "client", None)
    assert caller_of("SOLO", clients, BACKEND).upstream == BACKEND
    assert backend_actors(clients) == ["SOLO"]


def test_the_flat_form_still_reads_as_clients_acting_as_the_backend(tmp_path: Path) -> None:
    clients = read_credentials_file(_file(tmp_path, {"K1": "s1", "K2": "s2"}))
    assert clients == {"K1": ClientKey("s1"), "K2": ClientKey("s2")}
    assert caller_of("K1", clients, BACKEND) == Caller("K1", "client", BACKEND)
    assert backend_actors(clients) == ["K1", "K2"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"keys": {"K": {"secret": "s", "role": "root"}}}, "role must be admin or client"),
        ({"keys": {"K": {"role": "admin"}}}, 'needs "secret"'),
        ({"keys": {"K": {"secret": "s", "upstream": "other"}}}, 'upstream must be "self"'),
        ({"keys": {"K": {"secret": "s", "upstream": {"access_key_id": "x"}}}}, "upstream must"),
        ({"keys": {"K": {"secret": "s"}}}, "a client key says which store identity"),
        ({"keys": {"K": {"secret": "s", "role": "client"}}}, 'or "backend"'),
        ({"keys": {"K": {"secret": "s", "rol": "admin"}}}, "unknown fields ['rol']"),
        ({"keys": {}, "extra": 1}, 'expected only "keys"'),
        ({"K": 1}, "flat JSON object"),
        ([1, 2], "must hold a JSON object"),
    ],
)
def test_a_malformed_file_is_refused_naming_the_key_never_the_secret(
    tmp_path: Path, data: object, message: str
) -> None:
    with pytest.raises(ValueError) as caught:
        read_credentials_file(_file(tmp_path, data))
    assert message in str(caught.value)
    assert "'s'" not in str(caught.value)


def test_the_variable_pairs_give_a_client_and_an_admin() -> None:
    env = {
        **ENV,
        "HAPI_ACCESS_KEY_ID": "CLIENT",
        "HAPI_SECRET_ACCESS_KEY": "client-secret",
        "HAPI_ADMIN_ACCESS_KEY_ID": "OPERATOR",
        "HAPI_ADMIN_SECRET_ACCESS_KEY": "operator-secret",
    }
    settings = GatewaySettings.from_env(env)
    assert settings.clients == {
        "CLIENT": ClientKey("client-secret", "client"),
        "OPERATOR": ClientKey("operator-secret", "admin"),
    }
    assert settings.client_secrets == {"CLIENT": "client-secret", "OPERATOR": "operator-secret"}


def test_the_cache_key_is_derived_from_the_backend_secret_unless_one_is_set(
    tmp_path: Path,
) -> None:
    env = {**ENV, "HAPI_ACCESS_KEY_ID": "CLIENT", "HAPI_SECRET_ACCESS_KEY": "client-secret"}
    derived = GatewaySettings.from_env(env)
    assert derived.cache_mac_key == GatewaySettings.from_env(env).cache_mac_key
    other = GatewaySettings.from_env({**env, "HAPI_BACKEND_SECRET_ACCESS_KEY": "another"})
    assert other.cache_mac_key != derived.cache_mac_key
    secret = tmp_path / "cache-secret"
    secret.write_text("shared by every gateway\n")
    configured = GatewaySettings.from_env({**env, "HAPI_CACHE_SECRET_FILE": str(secret)})
    assert configured.cache_secret == "shared by every gateway"
    assert configured.cache_mac_key not in (derived.cache_mac_key, b"")
    assert "shared by every gateway" not in repr(configured)
    empty = tmp_path / "empty"
    empty.write_text("")
    with pytest.raises(ValueError, match="is empty"):
        GatewaySettings.from_env({**env, "HAPI_CACHE_SECRET_FILE": str(empty)})


@pytest.mark.parametrize(
    ("source", "bucket"),
    [
        ("/hapi-cache/features/a", "hapi-cache"),
        ("hapi-cache/features/a?versionId=3", "hapi-cache"),
        ("%2Fhapi-cache%2Ffeatures%2Fa", "hapi-cache"),
        ("data/a.jpg", "data"),
    ],
)
def test_a_copy_source_names_its_bucket_however_it_is_written(source: str, bucket: str) -> None:
    headers = [("x-amz-copy-source", source)]
    operation = parse_operation("PUT", "/mine/copy", "", headers, ())
    assert operation.name == "CopyObject"
    assert operation.copy_source is not None and operation.copy_source.bucket == bucket


def test_a_copy_source_with_an_empty_bucket_is_refused() -> None:
    headers = [("x-amz-copy-source", "//hapi-models/models/x/latest")]
    with pytest.raises(InvalidBucketName):
        parse_operation("PUT", "/mine/copy", "", headers, ())
