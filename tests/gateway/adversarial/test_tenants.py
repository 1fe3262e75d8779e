"""Trust between tenants, tried as a second, hostile tenant of the same gateway would try it.

Real store with two tenant identities whose permissions differ (alice and bob each own
the buckets named after them, see ``tests/conftest.py``), a real gateway whose
credentials file maps each tenant's gateway key to its own store identity (alice as
``"self"``, bob through an explicit pair), and an admin key. Every request the gateway
refuses must leave the store as it was.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import secrets
from collections.abc import Iterator
from typing import Any

import boto3
import httpx
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from skimage import data as samples

from hapi.gateway import sign_request
from hapi.protocol import Credentials, expand_entry
from hapi.protocol import decode_features as decode
from tests.conftest import TENANTS
from tests.support import (
    RunningGateway,
    cache_writes_settled,
    empty_bucket,
    encode_image,
    store_gateway,
    wait_for,
)

CACHE = "hapi-cache"
REGISTRY = "hapi-models"
BOB_GATEWAY = Credentials("BOBGW" + secrets.token_hex(6).upper(), secrets.token_hex(20))
ADMIN = Credentials("OPERATOR" + secrets.token_hex(6).upper(), secrets.token_hex(20))


@pytest.fixture(scope="module")
def tenant_gateway(
    store: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    """A gateway whose keys act upstream as the tenants' own store identities. It keeps no
    pack in memory (``--cache-memory-bytes 0``), so every hit reads its entry from the
    store, where a forgery lies (a gateway's own copies in memory are written by no one
    else)."""
    alice, bob = TENANTS["alice"], TENANTS["bob"]
    keys = {
        alice.access_key_id: {"secret": alice.secret_access_key, "upstream": "self"},
        BOB_GATEWAY.access_key_id: {
            "secret": BOB_GATEWAY.secret_access_key,
            "upstream": {
                "access_key_id": bob.access_key_id,
                "secret_access_key": bob.secret_access_key,
            },
        },
        ADMIN.access_key_id: {"secret": ADMIN.secret_access_key, "role": "admin"},
    }
    with store_gateway(
        store,
        tmp_path_factory.mktemp("tenant-gateway"),
        keys=keys,
        extra_args=("--cache-memory-bytes", "0"),
    ) as running:
        yield running


def _boto(at: RunningGateway | str, creds: Credentials, signature: str = "s3v4") -> Any:
    """A boto3 client of a gateway (or of an endpoint URL) signing as ``creds``."""
    return boto3.client(
        "s3",
        endpoint_url=at if isinstance(at, str) else at.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=creds.access_key_id,
        aws_secret_access_key=creds.secret_access_key,
        config=Config(
            signature_version=signature,
            s3={"addressing_style": "path"},
            retries={"max_attempts": 1},
        ),
    )


def _get(
    gw: RunningGateway, creds: Credentials, path: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    url = gw.endpoint_url + path
    signed = sign_request(
        method="GET",
        url=url,
        headers=dict(headers or {}),
        credentials=creds,
        region="us-east-1",
        payload_sha256=hashlib.sha256(b"").hexdigest(),
    )
    return httpx.get(url, headers=signed, timeout=120)


def _post(gw: RunningGateway, creds: Credentials, path: str, body: bytes) -> httpx.Response:
    url = gw.endpoint_url + path
    signed = sign_request(
        method="POST",
        url=url,
        headers={},
        credentials=creds,
        region="us-east-1",
        payload_sha256=hashlib.sha256(body).hexdigest(),
    )
    return httpx.post(url, content=body, headers=signed, timeout=120)


def _code(reply: httpx.Response) -> str:
    found = re.search(rb"<Code>([^<]+)</Code>", reply.content)
    return found.group(1).decode() if found else ""


def _denied(call: Any) -> None:
    with pytest.raises(ClientError) as caught:
        call()
    assert caught.value.response["Error"]["Code"] == "AccessDenied", caught.value.response


def _metric(gw: RunningGateway, pattern: str) -> float:
    reply = _get(gw, ADMIN, "/metrics")
    assert reply.status_code == 200, reply.text
    return sum(float(v) for v in re.findall(pattern + r" (\S+)$", reply.text, re.M))


@pytest.fixture(scope="module")
def alice_bucket(store: Any, backend_s3: Any) -> Iterator[str]:
    """A private bucket of alice's with one photo, created through her own store identity."""
    name = f"alice-{secrets.token_hex(4)}"
    alice = _boto(store.endpoint_url, TENANTS["alice"])
    alice.create_bucket(Bucket=name)
    alice.put_object(Bucket=name, Key="cat.jpg", Body=encode_image(samples.chelsea(), "JPEG"))
    alice.put_object(Bucket=name, Key="rocket.jpg", Body=encode_image(samples.rocket(), "JPEG"))
    yield name
    empty_bucket(backend_s3, name)
    backend_s3.delete_bucket(Bucket=name)


# -- one tenant cannot read another's private bucket, on any path ----------------------------


def test_each_key_acts_upstream_as_its_own_identity(tenant_gateway, alice_bucket) -> None:
    alice, bob = _boto(tenant_gateway, TENANTS["alice"]), _boto(tenant_gateway, BOB_GATEWAY)
    assert alice.get_object(Bucket=alice_bucket, Key="cat.jpg")["Body"].read()[:2] == b"\xff\xd8"
    _denied(lambda: bob.get_object(Bucket=alice_bucket, Key="cat.jpg"))
    _denied(lambda: bob.put_object(Bucket=alice_bucket, Key="bob.txt", Body=b"mine now"))
    _denied(lambda: bob.delete_object(Bucket=alice_bucket, Key="cat.jpg"))
    _denied(lambda: bob.list_objects_v2(Bucket=alice_bucket))
    keys = {o["Key"] for o in alice.list_objects_v2(Bucket=alice_bucket)["Contents"]}
    assert keys == {"cat.jpg", "rocket.jpg"}  # nothing bob tried changed the bucket


def test_pushdown_and_batches_fetch_as_the_caller(tenant_gateway, registered, alice_bucket):
    path = f"/{alice_bucket}/cat.jpg?hapi-model=r18&hapi-split=2&hapi-cache=bypass"
    assert _get(tenant_gateway, TENANTS["alice"], path).status_code == 200
    stolen = _get(tenant_gateway, BOB_GATEWAY, path)
    assert (stolen.status_code, _code(stolen)) == (403, "AccessDenied"), stolen.text
    body = json.dumps({"keys": ["cat.jpg", "rocket.jpg"], "model": "r18", "split": 2}).encode()
    batch = _post(tenant_gateway, BOB_GATEWAY, f"/{alice_bucket}?hapi-batch", body)
    assert (batch.status_code, _code(batch)) == (403, "AccessDenied"), batch.text


def test_a_cache_hit_is_served_only_to_a_caller_who_may_read_the_object(
    tenant_gateway, registered, alice_bucket
) -> None:
    path = f"/{alice_bucket}/rocket.jpg?hapi-model=r18&hapi-split=3"
    _get(tenant_gateway, TENANTS["alice"], path)

    def hit() -> bool:
        reply = _get(tenant_gateway, TENANTS["alice"], path)
        return reply.headers.get("x-hapi-cache") == "hit"

    wait_for(hit, "alice's features to be cached")
    stolen = _get(tenant_gateway, BOB_GATEWAY, path)
    assert (stolen.status_code, _code(stolen)) == (403, "AccessDenied"), stolen.text
    assert "x-hapi-cache" not in stolen.headers


# -- the internal buckets belong to operators ------------------------------------------------


@pytest.fixture(scope="module")
def planted(tenant_gateway: RunningGateway, backend_s3: Any) -> Iterator[dict[str, bytes]]:
    """An object in each internal bucket (written by the store's own identity), to steal
    and to overwrite."""
    for bucket in (CACHE, REGISTRY):
        with contextlib.suppress(backend_s3.exceptions.BucketAlreadyOwnedByYou):
            backend_s3.create_bucket(Bucket=bucket)
    objects = {
        CACHE: b"an entry of someone else's features",
        REGISTRY: b'{"a": "manifest"}',
    }
    name = f"tenants-test/{secrets.token_hex(4)}"
    for bucket, body in objects.items():
        backend_s3.put_object(Bucket=bucket, Key=name, Body=body)
    yield {"key": name.encode(), **objects}
    for bucket in objects:
        backend_s3.delete_object(Bucket=bucket, Key=name)


def _unchanged(backend_s3: Any, planted: dict[str, bytes]) -> None:
    key = planted["key"].decode()
    for bucket in (CACHE, REGISTRY):
        assert backend_s3.get_object(Bucket=bucket, Key=key)["Body"].read() == planted[bucket]
        listed = backend_s3.list_objects_v2(Bucket=bucket, Prefix="tenants-test/")
        assert [o["Key"] for o in listed.get("Contents", [])] == [key], bucket


@pytest.mark.parametrize(
    "attempt",
    [
        "list",
        "get",
        "head",
        "put",
        "delete",
        "multipart",
        "batch delete",
        "copy out",
        "copy in",
        "tagging",
    ],
)
def test_a_client_cannot_touch_the_cache_bucket(
    tenant_gateway, planted, backend_s3, alice_bucket, attempt
) -> None:
    alice = _boto(tenant_gateway, TENANTS["alice"])
    key = planted["key"].decode()
    calls = {
        "list": lambda: alice.list_objects_v2(Bucket=CACHE),
        "get": lambda: alice.get_object(Bucket=CACHE, Key=key),
        "head": lambda: alice.head_object(Bucket=CACHE, Key=key),
        "put": lambda: alice.put_object(Bucket=CACHE, Key=key, Body=b"forged"),
        "delete": lambda: alice.delete_object(Bucket=CACHE, Key=key),
        "multipart": lambda: alice.create_multipart_upload(Bucket=CACHE, Key=key),
        "batch delete": lambda: alice.delete_objects(
            Bucket=CACHE, Delete={"Objects": [{"Key": key}]}
        ),
        "copy out": lambda: alice.copy_object(
            Bucket=alice_bucket, Key="loot", CopySource={"Bucket": CACHE, "Key": key}
        ),
        "copy in": lambda: alice.copy_object(
            Bucket=CACHE, Key=key, CopySource={"Bucket": alice_bucket, "Key": "cat.jpg"}
        ),
        "tagging": lambda: alice.put_object_tagging(
            Bucket=CACHE, Key=key, Tagging={"TagSet": [{"Key": "a", "Value": "b"}]}
        ),
    }
    if attempt == "head":  # a HEAD's error has no body: the status says it
        with pytest.raises(ClientError) as caught:
            calls[attempt]()
        assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    else:
        _denied(calls[attempt])
    _unchanged(backend_s3, planted)
    assert "loot" not in {
        o["Key"] for o in backend_s3.list_objects_v2(Bucket=alice_bucket).get("Contents", [])
    }


@pytest.mark.parametrize(
    "attempt",
    ["put", "rewrite latest", "delete", "multipart", "batch delete", "copy in", "tagging"],
)
def test_a_client_cannot_write_the_registry(
    tenant_gateway, planted, backend_s3, alice_bucket, registered, attempt
) -> None:
    alice = _boto(tenant_gateway, TENANTS["alice"])
    key = planted["key"].decode()
    calls = {
        "put": lambda: alice.put_object(Bucket=REGISTRY, Key=key, Body=b"{}"),
        "rewrite latest": lambda: alice.put_object(
            Bucket=REGISTRY, Key="models/r18/latest", Body=b"999"
        ),
        "delete": lambda: alice.delete_object(Bucket=REGISTRY, Key=key),
        "multipart": lambda: alice.create_multipart_upload(Bucket=REGISTRY, Key=key),
        "batch delete": lambda: alice.delete_objects(
            Bucket=REGISTRY, Delete={"Objects": [{"Key": key}]}
        ),
        "copy in": lambda: alice.copy_object(
            Bucket=REGISTRY, Key=key, CopySource={"Bucket": alice_bucket, "Key": "cat.jpg"}
        ),
        "tagging": lambda: alice.put_object_tagging(
            Bucket=REGISTRY, Key=key, Tagging={"TagSet": [{"Key": "a", "Value": "b"}]}
        ),
    }
    latest = backend_s3.get_object(Bucket=REGISTRY, Key="models/r18/latest")["Body"].read()
    _denied(calls[attempt])
    _unchanged(backend_s3, planted)
    assert backend_s3.get_object(Bucket=REGISTRY, Key="models/r18/latest")["Body"].read() == latest


def test_clients_still_read_the_registry_and_admins_write_it(
    tenant_gateway, planted, backend_s3, registered
) -> None:
    alice, admin = _boto(tenant_gateway, TENANTS["alice"]), _boto(tenant_gateway, ADMIN)
    key = planted["key"].decode()
    assert alice.get_object(Bucket=REGISTRY, Key=key)["Body"].read() == planted[REGISTRY]
    assert alice.list_objects_v2(Bucket=REGISTRY, Prefix="models/r18/")["KeyCount"] >= 2
    admin.put_object(Bucket=REGISTRY, Key=key + ".admin", Body=b"ok")
    assert admin.get_object(Bucket=CACHE, Key=key)["Body"].read() == planted[CACHE]
    admin.delete_object(Bucket=REGISTRY, Key=key + ".admin")


def test_presigned_and_virtual_hosted_requests_are_held_to_the_same_rule(
    tenant_gateway, planted, backend_s3
) -> None:
    key = planted["key"].decode()
    for version in ("s3v4", "s3"):  # SigV4 and the legacy V2 presigned URL
        alice = _boto(tenant_gateway, TENANTS["alice"], version)
        for method in ("get_object", "put_object", "delete_object"):
            url = alice.generate_presigned_url(method, Params={"Bucket": CACHE, "Key": key})
            reply = httpx.request(
                {"get_object": "GET", "put_object": "PUT", "delete_object": "DELETE"}[method],
                url,
                content=b"forged" if method == "put_object" else None,
            )
            assert (reply.status_code, _code(reply)) == (403, "AccessDenied"), (version, method)
    port = tenant_gateway.endpoint_url.rsplit(":", 1)[1]
    url = f"http://{CACHE}.localhost:{port}/{key}"
    signed = sign_request(
        method="GET",
        url=url,
        headers={},
        credentials=TENANTS["alice"],
        region="us-east-1",
        payload_sha256=hashlib.sha256(b"").hexdigest(),
    )
    reply = httpx.get(
        f"{tenant_gateway.endpoint_url}/{key}",
        headers={**signed, "host": f"{CACHE}.localhost:{port}"},
    )
    assert (reply.status_code, _code(reply)) == (403, "AccessDenied"), reply.text
    _unchanged(backend_s3, planted)


def test_pushdown_naming_an_internal_bucket_is_refused(tenant_gateway, planted, registered):
    key = planted["key"].decode()
    reply = _get(tenant_gateway, TENANTS["alice"], f"/{CACHE}/{key}?hapi-model=r18&hapi-split=1")
    assert (reply.status_code, _code(reply)) == (403, "AccessDenied"), reply.text
    body = json.dumps({"keys": [key], "model": "r18", "split": 1}).encode()
    batch = _post(tenant_gateway, TENANTS["alice"], f"/{CACHE}?hapi-batch", body)
    assert (batch.status_code, _code(batch)) == (403, "AccessDenied"), batch.text


def test_a_form_upload_into_an_internal_bucket_is_refused(
    tenant_gateway, planted, backend_s3
) -> None:
    alice = _boto(tenant_gateway, TENANTS["alice"])
    key = planted["key"].decode()
    for bucket in (CACHE, REGISTRY):
        post = alice.generate_presigned_post(bucket, key)
        reply = httpx.post(post["url"], data=post["fields"], files={"file": b"forged"})
        assert (reply.status_code, _code(reply)) == (403, "AccessDenied"), reply.text
        unsigned = httpx.post(
            f"{tenant_gateway.endpoint_url}/{bucket}", data={"key": key}, files={"file": b"x"}
        )
        assert (unsigned.status_code, _code(unsigned)) == (403, "AccessDenied"), unsigned.text
    _unchanged(backend_s3, planted)


# -- cache entries are authenticated ---------------------------------------------------------


def _entry_of(backend_s3: Any, before: set[str]) -> str:
    """The one pack written since ``before`` (every page of the listing: a long session
    leaves more than one page of packs)."""
    found: list[str] = []

    def written() -> bool:
        found[:] = sorted(_cache_keys(backend_s3) - before)
        return bool(found)

    wait_for(written, "the entry's pack to be written")
    (pack,) = found
    return pack


def _members(body: bytes) -> list[tuple[str, bytes]]:
    """A pack's entries (path, bytes), in its order."""
    from hapi.protocol import PACK_HEAD, pack_index_length, parse_pack_index

    members = parse_pack_index(body[PACK_HEAD : PACK_HEAD + pack_index_length(body)])
    return [(m.path, body[m.offset : m.offset + m.length]) for m in members.values()]


def _cache_keys(backend_s3: Any) -> set[str]:
    try:
        listed = backend_s3.get_paginator("list_objects_v2").paginate(Bucket=CACHE)
        return {o["Key"] for page in listed for o in page.get("Contents", [])}
    except backend_s3.exceptions.NoSuchBucket:
        return set()


@pytest.mark.parametrize("forgery", ["features replaced", "another object's pack"])
def test_an_entry_forged_in_the_store_is_never_served(
    tenant_gateway, registered, alice_bucket, backend_s3, forgery
) -> None:
    from hapi.protocol import encode_features, encode_pack

    split = {"features replaced": 4, "another object's pack": 5}[forgery]
    path = f"/{alice_bucket}/cat.jpg?hapi-model=r18&hapi-split={split}"
    cache_writes_settled(tenant_gateway)  # no pack of an earlier test still to land
    before = _cache_keys(backend_s3)
    truth = _get(tenant_gateway, TENANTS["alice"], path)
    assert truth.headers["x-hapi-cache"] == "miss"
    pack = _entry_of(backend_s3, before)
    stored = backend_s3.get_object(Bucket=CACHE, Key=pack)
    if forgery == "features replaced":
        # Same key, same metadata (the MAC header copied), the features zeroed, and the
        # pack's index made to match them.
        ((name, entry),) = _members(stored["Body"].read())
        tensors, meta = decode(expand_entry(entry))  # kept without its zeros
        zeroed = encode_features(tensors["features"] * 0, dtype="float32", metadata=dict(meta))
        forged, _ = encode_pack([(name, bytes(zeroed))])
    else:
        # A valid pack, MAC and all, of another object, copied over this one's.
        other = f"/{alice_bucket}/rocket.jpg?hapi-model=r18&hapi-split={split}"
        before = _cache_keys(backend_s3)
        _get(tenant_gateway, TENANTS["alice"], other)
        stored = backend_s3.get_object(Bucket=CACHE, Key=_entry_of(backend_s3, before))
        forged = stored["Body"].read()
    backend_s3.put_object(Bucket=CACHE, Key=pack, Body=forged, Metadata=stored["Metadata"])
    wait_for(  # the store serves the forgery before the gateway is asked again
        lambda: backend_s3.get_object(Bucket=CACHE, Key=pack)["Body"].read() == forged,
        "the store to serve the forged pack",
    )
    rejected = _metric(tenant_gateway, r'^hapi_cache_lookups_total\{[^}]*result="rejected"[^}]*\}')
    again = _get(tenant_gateway, TENANTS["alice"], path)
    assert again.status_code == 200 and again.headers["x-hapi-cache"] == "miss"
    assert decode(again.content)[0]["features"].tobytes() == (
        decode(truth.content)[0]["features"].tobytes()
    )
    after = _metric(tenant_gateway, r'^hapi_cache_lookups_total\{[^}]*result="rejected"[^}]*\}')
    assert after == rejected + 1
    assert "cache entry not as its pack's index says" in tenant_gateway.log()
    assert stored["Metadata"].get("hapi-mac"), "packs carry their MAC as metadata"


@pytest.mark.parametrize("mac", ["none", "another pack's"])
def test_a_pack_planted_in_the_store_is_never_read(
    store, tenant_gateway, registered, alice_bucket, backend_s3, mac
) -> None:
    # An entry of an object no gateway computed yet, zeroed, in a pack under its context's
    # prefix, written into the store directly: its MAC does not hold, so its index is
    # never read and the object is computed.
    import time

    from hapi.gateway.pushdown._cache import INDEX_TTL_S
    from hapi.protocol import ObjectIdentity, cache_key, encode_features, encode_pack, entry_path

    split = {"none": 3, "another pack's": 6}[mac]
    fresh = f"planted-{secrets.token_hex(4)}.jpg"  # an object no earlier test computed
    alice = _boto(store.endpoint_url, TENANTS["alice"])
    alice.put_object(Bucket=alice_bucket, Key=fresh, Body=encode_image(samples.coffee(), "JPEG"))
    cache_writes_settled(tenant_gateway)  # no pack of an earlier test still to land
    before = _cache_keys(backend_s3)
    cat = _get(
        tenant_gateway,
        TENANTS["alice"],
        f"/{alice_bucket}/cat.jpg?hapi-model=r18&hapi-split={split}",
    )
    assert cat.headers["x-hapi-cache"] == "miss"
    genuine = _entry_of(backend_s3, before)  # its key names the context's prefix
    stored = backend_s3.get_object(Bucket=CACHE, Key=genuine)
    ((_, entry),) = _members(stored["Body"].read())
    tensors, meta = decode(expand_entry(entry))  # kept without its zeros
    head = backend_s3.head_object(Bucket=alice_bucket, Key=fresh)
    identity = ObjectIdentity(
        bucket=alice_bucket,
        key=fresh,
        etag=head["ETag"].strip('"'),
        size=head["ContentLength"],
    )
    manifest = registered["r18"]
    name = entry_path(
        cache_key(
            identity,
            blocks=manifest.hashes[:split],
            preprocess=manifest.preprocess.to_dict(),
            dtype="float32",
        )
    )
    zeroed = encode_features(tensors["features"] * 0, dtype="float32", metadata=dict(meta))
    forged, _ = encode_pack([(name, bytes(zeroed))])
    planted = genuine.rsplit("/", 1)[0] + "/9999999999999-planted.pack"
    metadata = {} if mac == "none" else stored["Metadata"]
    backend_s3.put_object(Bucket=CACHE, Key=planted, Body=forged, Metadata=metadata)
    time.sleep(INDEX_TTL_S)  # the gateway's listing of the context is stale: it lists again
    reply = _get(
        tenant_gateway,
        TENANTS["alice"],
        f"/{alice_bucket}/{fresh}?hapi-model=r18&hapi-split={split}",
    )
    assert reply.status_code == 200 and reply.headers["x-hapi-cache"] == "miss"
    assert decode(reply.content)[0]["features"].any()  # computed, not the zeroed forgery
    assert "cache pack without a valid MAC was ignored" in tenant_gateway.log()
