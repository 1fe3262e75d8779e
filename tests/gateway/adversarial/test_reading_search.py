"""A search for requests the gateway and the store would read two ways.

Hypothesis generates variants of every write, delete, copy and list against both internal
buckets and another tenant's bucket: encodings of bucket and key (percent-encoding of any
character, ``%2F``, case, dot segments, trailing dots, double slashes), path-style and
virtual-hosted addressing, SigV4 in the header, SigV4 presigned, V2 presigned and unsigned,
aws-chunked bodies, browser form uploads (a signed policy, or none), repeated headers, and
extra or conflicting subresources and pushdown flags; each sent as an
anonymous caller, as a client key with a store identity of its own, and as a client key
acting as the backend identity (the store's administrator). After each, the store is read
directly: nothing written, deleted or copied out, and the answer shows nothing the caller
may not read. ``make test`` runs a bounded, reproducible search; ``make test-slow`` a longer,
random one. Whatever it finds becomes a named case in ``test_one_reading``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hapi.protocol import Credentials
from tests.conftest import TENANTS
from tests.gateway.adversarial._reading import (
    STREAMING_TRAILER,
    Raw,
    aws_chunked,
    content_md5,
    delete_body,
    form_upload,
    presigned_v2,
    presigned_v4,
    send,
    signed_v4,
)
from tests.support import RunningGateway, empty_bucket, store_gateway

REGISTRY, CACHE = "hapi-models", "hapi-cache"
EXAMPLES = 1000  # make test: the same variants every run (about 30 s here)
EXAMPLES_SLOW = 2500  # make test-slow: fresh random variants each run (about 10 min here)
CACHED = b"cached " + secrets.token_hex(8).encode()  # no client may read the cache
BOBS = b"bob's " + secrets.token_hex(8).encode()  # only bob and the store's administrator
PUBLIC = b"public " + secrets.token_hex(8).encode()  # in the registry: clients read it
HIDDEN = "hidden-" + secrets.token_hex(4)  # a key never named: shows only in a listing
QUERY_EXTRAS = [
    "hapi-batch",
    "hapi-model=r18",
    "HAPI-SPLIT=1",
    "delete",
    "%64elete",
    "Delete",
    "tagging",
    "uploads",
    "uploadId=1",
    "policy",
    "x-id=GetObject",
    "versionId=null",
    "list-type=2",
    "prefix=%2F..%2F",
]


@dataclass(frozen=True)
class World:
    """The gateway, who may call it, and what the store held before each example."""

    gateway: RunningGateway
    callers: dict[str, Credentials | None]
    victims: dict[str, str]  # bucket -> the key the operations name
    own: str  # a bucket every signed caller may write (the copies' other end)
    direct: Any  # boto3 at the store, as its own identity
    contents: dict[str, bytes]  # bucket -> what its named key holds

    def victims_of(self, caller: str) -> list[str]:
        """The buckets ``caller`` may not change: the internal ones, and bob's unless the
        caller acts as the store's administrator."""
        return sorted(b for b in self.victims if caller != "backend" or b in (REGISTRY, CACHE))

    def hidden_from(self, caller: str) -> list[bytes]:
        """What ``caller`` may not see: contents, and key names that only a listing shows."""
        hidden = [CACHED, HIDDEN.encode()]
        return hidden if caller == "backend" else [*hidden, BOBS]

    def snapshot(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "buckets": sorted(b["Name"] for b in self.direct.list_buckets()["Buckets"])
        }
        for bucket, key in self.victims.items():
            listed = self.direct.list_objects_v2(Bucket=bucket).get("Contents", [])
            state[bucket] = sorted((o["Key"], o["ETag"], o["Size"]) for o in listed)
            tags = self.direct.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]
            state[bucket + " tags"] = tags
        return state

    def restore(self, before: dict[str, Any]) -> None:
        """Put the store back as ``before`` found it, so that each example is judged on its
        own (and a failure shrinks to the request that caused it)."""
        now = {b["Name"] for b in self.direct.list_buckets()["Buckets"]}
        for bucket in now - set(before["buckets"]):
            empty_bucket(self.direct, bucket)
            self.direct.delete_bucket(Bucket=bucket)
        for bucket, key in self.victims.items():
            kept = {entry[0] for entry in before[bucket]}
            listed = self.direct.list_objects_v2(Bucket=bucket).get("Contents", [])
            for extra in {o["Key"] for o in listed} - kept:
                self.direct.delete_object(Bucket=bucket, Key=extra)
            self.direct.put_object(Bucket=bucket, Key=key, Body=self.contents[bucket])

    def copied_out(self) -> list[bytes]:
        """What copies left in the caller's own bucket (removed again)."""
        found = []
        for listed in self.direct.list_objects_v2(Bucket=self.own).get("Contents", []):
            if listed["Key"] != "seed":
                body = self.direct.get_object(Bucket=self.own, Key=listed["Key"])["Body"].read()
                found.append(body)
                self.direct.delete_object(Bucket=self.own, Key=listed["Key"])
        for upload in self.direct.list_multipart_uploads(Bucket=self.own).get("Uploads", []):
            self.direct.abort_multipart_upload(
                Bucket=self.own, Key=upload["Key"], UploadId=upload["UploadId"]
            )
        return found


def _boto(url: str, creds: Credentials) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id=creds.access_key_id,
        aws_secret_access_key=creds.secret_access_key,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


@pytest.fixture(scope="module")
def world(store: Any, backend_s3: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    alice, bob = TENANTS["alice"], TENANTS["bob"]
    keys = {alice.access_key_id: {"secret": alice.secret_access_key, "upstream": "self"}}
    existing = {b["Name"] for b in backend_s3.list_buckets()["Buckets"]}
    for bucket in (REGISTRY, CACHE):
        if bucket not in existing:
            backend_s3.create_bucket(Bucket=bucket)
    tag = secrets.token_hex(4)
    victims = {REGISTRY: f"search-{tag}/m", CACHE: f"search-{tag}/e", f"bob-{tag}": "private"}
    _boto(store.endpoint_url, bob).create_bucket(Bucket=f"bob-{tag}")
    contents = {REGISTRY: PUBLIC, CACHE: CACHED, f"bob-{tag}": BOBS}
    hidden_in = (CACHE, f"bob-{tag}")  # the registry's listing is anybody's to read
    for bucket, key in victims.items():
        backend_s3.put_object(Bucket=bucket, Key=key, Body=contents[bucket])
    for bucket in hidden_in:
        backend_s3.put_object(Bucket=bucket, Key=f"search-{tag}/{HIDDEN}", Body=contents[bucket])
    own = f"alice-{tag}"
    _boto(store.endpoint_url, alice).create_bucket(Bucket=own)
    backend_s3.put_object(Bucket=own, Key="seed", Body=b"seed")
    with store_gateway(store, tmp_path_factory.mktemp("search"), keys=keys) as gw:
        callers: dict[str, Credentials | None] = {
            "anonymous": None,
            "tenant": alice,
            "backend": Credentials(gw.access_key_id, gw.secret_access_key),
        }
        yield World(gw, callers, victims, own, backend_s3, contents)
    for bucket, key in victims.items():
        backend_s3.delete_object(Bucket=bucket, Key=key)
    for bucket in hidden_in:
        backend_s3.delete_object(Bucket=bucket, Key=f"search-{tag}/{HIDDEN}")
    for bucket in (f"bob-{tag}", own):
        empty_bucket(backend_s3, bucket)
        backend_s3.delete_bucket(Bucket=bucket)


# -- the generator --------------------------------------------------------------------------


def _percent(text: str, draw: st.DrawFn) -> str:
    """``text`` with a drawn subset of its characters percent-encoded (either hex case)."""
    out = []
    for char in text:
        if draw(st.integers(0, 3)) == 0:
            code = f"%{ord(char):02X}"
            out.append(code.lower() if draw(st.booleans()) else code)
        else:
            out.append(char)
    return "".join(out)


BUCKET_FORMS = [
    "plain",
    "percent",
    "slash-encoded",
    "slash-encoded-lower",
    "double-slash",
    "leading-double-slash",
    "upper",
    "trailing-dot",
    "dot-segment",
    "dot-dot-segment",
    "virtual-host",
]
KEY_FORMS = ["plain", "percent", "dot-dot", "double-slash", "dot"]


@st.composite
def addressing(draw: st.DrawFn, bucket: str, key: str, port_host: str) -> tuple[str, str | None]:
    """``(path, host)``: a spelling of ``/bucket/key`` and the Host header it needs."""
    key_form = draw(st.sampled_from(KEY_FORMS))
    written_key = {
        "plain": key,
        "percent": _percent(key, draw),
        "dot-dot": f"x/../{key}",
        "double-slash": f"/{key}",
        "dot": f"./{key}",
    }[key_form]
    form = draw(st.sampled_from(BUCKET_FORMS))
    if form == "virtual-host":
        return f"/{written_key}", f"{bucket}.localhost:{port_host}"
    written = {
        "plain": f"/{bucket}/",
        "percent": f"/{_percent(bucket, draw)}/",
        "slash-encoded": f"/{bucket}%2F",
        "slash-encoded-lower": f"/{bucket}%2f/",
        "double-slash": f"/{bucket}//",
        "leading-double-slash": f"//{bucket}/",
        "upper": f"/{bucket.upper()}/",
        "trailing-dot": f"/{bucket}./",
        "dot-segment": f"/./{bucket}/",
        "dot-dot-segment": f"/x/../{bucket}/",
    }[form]
    return written + (written_key if key else ""), None


OPERATIONS = [
    "put",
    "delete",
    "delete-objects",
    "copy-out",
    "copy-in",
    "part-copy-out",
    "list",
    "get",
    "put-tagging",
    "put-policy",
    "delete-bucket",
    "create-upload",
    "features",
    "form-upload",
]


@st.composite
def variants(draw: st.DrawFn, world: World) -> tuple[str, Raw]:
    caller = draw(st.sampled_from(sorted(world.callers)))
    creds = world.callers[caller]
    victim = draw(st.sampled_from(world.victims_of(caller)))
    victim_key = world.victims[victim]
    own = world.own
    port = world.gateway.endpoint_url.rsplit(":", 1)[1]
    operation = draw(st.sampled_from(OPERATIONS))
    url = world.gateway.endpoint_url
    if operation == "form-upload":
        path, _ = draw(addressing(victim, "", port))
        form_key = draw(st.sampled_from([victim_key, "new", "../" + victim_key, "${filename}"]))
        return caller, form_upload(url, creds, victim, form_key, path.rstrip("/") or "/")
    method, bucket, key, query, headers, body = _operation(operation, victim, victim_key, own)
    path, host = draw(addressing(bucket, key, port))
    extras = draw(st.lists(st.sampled_from(QUERY_EXTRAS), max_size=2))
    query = "&".join(filter(None, [query, *extras]))
    repeat: list[tuple[str, str]] = []
    if draw(st.booleans()):
        repeat.append(
            draw(
                st.sampled_from(
                    [
                        ("x-amz-copy-source", f"/{victim}/{victim_key}"),
                        ("x-amz-copy-source", f"/{own}/seed"),
                        ("x-hapi-model", "r18"),
                        ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
                        ("host", f"{victim}.localhost:{port}"),
                    ]
                )
            )
        )
    if draw(st.booleans()):
        headers, repeat = [*headers, *repeat], []  # signed once, not repeated
    target = path + ("?" + query if query else "")
    signing = draw(st.sampled_from(["v4", "v4-presigned", "v2-presigned"]))
    payload = None
    if body and method == "PUT" and draw(st.booleans()):  # as current SDKs upload
        framing, body = aws_chunked(body)
        headers, payload = [*headers, *framing], STREAMING_TRAILER
    if creds is None:
        hosted = [("host", host or url.split("//", 1)[1])]
        if payload is not None:
            hosted.append(("x-amz-content-sha256", payload))
        raw = Raw(method, target, [*hosted, *headers, *repeat], body)
    elif signing == "v4" or body or headers:
        raw = signed_v4(
            url, creds, method, target, headers, body, host=host, repeat=repeat, payload=payload
        )
    elif signing == "v4-presigned":
        raw = presigned_v4(url, creds, method, path, query)
    else:
        raw = presigned_v2(url, creds, method, path, query)
    return caller, raw


def _operation(
    name: str, victim: str, key: str, own: str
) -> tuple[str, str, str, str, list[tuple[str, str]], bytes]:
    """``(method, bucket, key, query, headers, body)`` of one operation on ``victim``."""
    if name == "delete-objects":
        body = delete_body([key])
        return "POST", victim, "", "delete", [("content-md5", content_md5(body))], body
    if name == "put-tagging":
        body = b"<Tagging><TagSet><Tag><Key>a</Key><Value>b</Value></Tag></TagSet></Tagging>"
        return "PUT", victim, key, "tagging", [("content-md5", content_md5(body))], body
    if name == "put-policy":
        return "PUT", victim, "", "policy", [], json.dumps({"Version": "2012-10-17"}).encode()
    simple: dict[str, tuple[str, str, str, str, list[tuple[str, str]], bytes]] = {
        "put": ("PUT", victim, key, "", [], b"overwritten"),
        "delete": ("DELETE", victim, key, "", [], b""),
        "copy-out": ("PUT", own, "loot", "", [("x-amz-copy-source", f"/{victim}/{key}")], b""),
        "copy-in": ("PUT", victim, key, "", [("x-amz-copy-source", f"/{own}/seed")], b""),
        "part-copy-out": (
            "PUT",
            own,
            "loot",
            "partNumber=1&uploadId=none",
            [("x-amz-copy-source", f"/{victim}/{key}")],
            b"",
        ),
        "list": ("GET", victim, "", "list-type=2", [], b""),
        "get": ("GET", victim, key, "", [], b""),
        "delete-bucket": ("DELETE", victim, "", "", [], b""),
        "create-upload": ("POST", victim, "new", "uploads", [], b""),
        "features": ("GET", victim, key, "hapi-model=nosuch&hapi-split=1", [], b""),
    }
    return simple[name]


# -- the property -----------------------------------------------------------------------------


def _check(world: World, before: dict[str, Any], caller: str, raw: Raw) -> None:
    reply = send(world.gateway.endpoint_url, raw)
    seen = (caller, raw, reply.status, reply.body[:300])
    hidden = world.hidden_from(caller)
    assert not any(secret in reply.body for secret in hidden), seen
    assert not any(secret in copy for copy in world.copied_out() for secret in hidden), seen
    after = _snapshot_or_damage(world)
    if after != before:
        world.restore(before)
    assert after == before, seen


def _snapshot_or_damage(world: World) -> dict[str, Any]:
    try:
        return world.snapshot()
    except ClientError as exc:  # a victim's key is gone
        return {"damaged": str(exc)}


def _search(world: World, examples: int, *, reproducible: bool) -> None:
    """Send ``examples`` generated variants, each judged against the store as it was."""
    before = world.snapshot()

    @settings(
        max_examples=examples,
        derandomize=reproducible,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(data=st.data())
    def search(data: st.DataObject) -> None:
        caller, raw = data.draw(variants(world))
        _check(world, before, caller, raw)

    search()


@pytest.mark.timeout(600)
def test_no_variant_changes_the_store_or_shows_what_the_caller_may_not_read(world: World) -> None:
    _search(world, EXAMPLES, reproducible=True)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_longer_random_search(world: World) -> None:
    _search(world, EXAMPLES_SLOW, reproducible=False)
