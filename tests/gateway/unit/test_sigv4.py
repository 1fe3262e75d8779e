"""SigV4 verification and signing, with botocore's own signers as the ground truth."""

from __future__ import annotations

import hmac
import io
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, urlsplit

import boto3
import botocore.auth
import pytest
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials as BotoCredentials

from hapi.gateway import sign_request
from hapi.gateway._errors import (
    AccessDenied,
    AuthorizationHeaderMalformed,
    AuthorizationQueryParametersError,
    InvalidAccessKeyId,
    InvalidArgument,
    InvalidRequest,
    RequestTimeTooSkewed,
    SignatureDoesNotMatch,
)
from hapi.gateway._operation import parse_operation
from hapi.gateway.edge._sigv4 import Verified, verify_request
from hapi.protocol import Credentials

AKID = "AKIDEXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
SECRETS = {AKID: SECRET}
T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
ENDPOINT = "http://127.0.0.1:9000"
UNUSUAL_KEYS = ["a b", "ü/ñ.txt", "a+b", "x=y&z", "tilde~", "dir//x/./y/../z", "%41", "*!'()"]


@pytest.fixture(autouse=True)
def frozen_botocore(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        botocore.auth, "get_current_datetime", lambda *_, **__: T0.replace(tzinfo=None)
    )


def botocore_signed(
    method: str,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    params: dict[str, str] | None = None,
    presign: int | None = None,
) -> AWSRequest:
    request = AWSRequest(method=method, url=url, headers=headers or {}, data=body, params=params)
    creds = BotoCredentials(AKID, SECRET)
    if presign is None:
        S3SigV4Auth(creds, "s3", "us-east-1").add_auth(request)
    else:
        S3SigV4QueryAuth(creds, "s3", "us-east-1", expires=presign).add_auth(request)
    return request


def wire(request: AWSRequest) -> dict[str, object]:
    """The request as the gateway receives it: raw path and query, lowercase headers."""
    prepared = request.prepare()
    parts = urlsplit(prepared.url)
    headers = [
        (name.lower(), value.decode("latin-1") if isinstance(value, bytes) else str(value))
        for name, value in prepared.headers.items()
    ]
    if not any(name == "host" for name, _ in headers):
        headers.append(("host", parts.netloc))
    return {
        "method": prepared.method,
        "raw_path": parts.path,
        "raw_query": parts.query,
        "headers": headers,
    }


def verify(received: dict[str, object], **overrides: object) -> Verified:
    arguments: dict[str, object] = {"secrets": SECRETS, "now": T0, **received, **overrides}
    return verify_request(**arguments)


def replace_header(received: dict[str, object], name: str, value: str) -> dict[str, object]:
    headers = [(n, value if n == name else v) for n, v in received["headers"]]
    return {**received, "headers": headers}


# --- verify_request: header form -----------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "params", "body"),
    [
        ("GET", "/bucket/key", None, b""),
        ("GET", "/bucket", {"list-type": "2", "prefix": "a b", "continuation-token": "t/+=="}, b""),
        ("PUT", "/bucket/key", {"uploadId": "u~p+/=", "partNumber": "1"}, b"part data"),
        ("PUT", "/bucket/key", {"tagging": ""}, b"<Tagging/>"),
        ("DELETE", "/bucket/key", {"versionId": "3/L4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY"}, b""),
        ("PUT", "/", None, b""),
    ],
)
def test_verifies_botocore_header_signatures(method, path, params, body):
    received = wire(botocore_signed(method, ENDPOINT + path, body=body, params=params))
    verified = verify(received)
    assert verified.access_key_id == AKID
    assert verified.payload_mode == "sha256"
    assert verified.scope == "20260101/us-east-1/s3/aws4_request"
    assert verified.amz_date == "20260101T120000Z"


@pytest.mark.parametrize("key", UNUSUAL_KEYS)
def test_verifies_unusual_keys_signed_the_way_botocore_sends_them(key):
    url = f"{ENDPOINT}/bucket/{quote(key, safe='/~')}"
    received = wire(botocore_signed("PUT", url, body=b"x", headers={"Content-Type": "text/plain"}))
    assert verify(received).payload_sha256 is not None


@pytest.mark.parametrize(
    "query",
    ["tagging", "prefix=a%20b&list-type=2", "a=%2f&b=%7E&c=+", "versions&prefix=%C3%BC", "x=1&x=0"],
)
def test_verifies_query_strings_signed_as_sent(query):
    # botocore signs a query given in the URL token by token as it stands, unencoded forms included.
    received = wire(botocore_signed("GET", f"{ENDPOINT}/bucket?{query}"))
    assert verify(received).access_key_id == AKID


def test_verifies_real_boto3_client_requests():
    requests = capture_boto3_requests("http://127.0.0.1:9000") + capture_boto3_requests(
        "https://s3.example.test"
    )
    assert len(requests) == 10
    for received in requests:
        verify(received)


def test_boto3_streams_puts_over_https_with_unsigned_trailers():
    put = capture_boto3_requests("https://s3.example.test")[0]
    verified = verify(put)
    assert verified.payload_mode == "streaming-unsigned-trailer"
    assert verified.trailer_names == ("x-amz-checksum-crc32",)
    assert verified.decoded_content_length == 5
    plain_http_put = capture_boto3_requests("http://127.0.0.1:9000")[0]
    assert verify(plain_http_put).payload_mode == "sha256"


def capture_boto3_requests(endpoint: str) -> list[dict[str, object]]:
    captured: list[dict[str, object]] = []

    class Captured(Exception):
        pass

    def before_send(request, **_):
        parts = urlsplit(request.url)
        headers = [
            (name.lower(), value.decode("latin-1") if isinstance(value, bytes) else str(value))
            for name, value in request.headers.items()
        ]
        headers.append(("host", parts.netloc))
        captured.append(
            {
                "method": request.method,
                "raw_path": parts.path,
                "raw_query": parts.query,
                "headers": headers,
            }
        )
        raise Captured

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="eu-west-1",
        aws_access_key_id=AKID,
        aws_secret_access_key=SECRET,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )
    client.meta.events.register("before-send", before_send)
    calls = [
        lambda: client.put_object(Bucket="b", Key="a b+c=d~ü", Body=b"hello", Metadata={"m": "v"}),
        lambda: client.list_objects_v2(Bucket="b", Prefix="a b+/ü", ContinuationToken="t/+=="),
        lambda: client.upload_part(Bucket="b", Key="k", UploadId="u+/=", PartNumber=3, Body=b"x"),
        lambda: client.put_object_tagging(
            Bucket="b", Key="k", Tagging={"TagSet": [{"Key": "a", "Value": "b"}]}
        ),
        lambda: client.get_object(Bucket="b", Key="dir/ü x", Range="bytes=0-9"),
    ]
    for call in calls:
        with pytest.raises(Captured):
            call()
    return captured


def test_duplicate_headers_are_joined_with_commas():
    request = AWSRequest(method="GET", url=ENDPOINT + "/bucket/key")
    request.headers["X-Amz-Meta-Tag"] = "one"
    request.headers["X-Amz-Meta-Tag"] = "  two   words "  # email.message appends a second header
    S3SigV4Auth(BotoCredentials(AKID, SECRET), "s3", "us-east-1").add_auth(request)
    headers = [(name.lower(), value) for name, value in request.headers.items()]
    assert [v for n, v in headers if n == "x-amz-meta-tag"] == ["one", "  two   words "]
    received = {**wire(request), "headers": [*headers, ("host", "127.0.0.1:9000")]}
    verify(received)
    swapped = [(n, "two words" if v == "one" else v) for n, v in received["headers"]]
    with pytest.raises(SignatureDoesNotMatch):
        verify({**received, "headers": swapped})


def test_date_header_instead_of_x_amz_date():
    request = botocore_signed("GET", ENDPOINT + "/bucket/key", headers={"Date": "whatever"})
    received = wire(request)
    assert not any(name == "x-amz-date" for name, _ in received["headers"])
    assert verify(received).amz_date == "20260101T120000Z"


@pytest.mark.parametrize(
    "tamper",
    [
        lambda r: {**r, "method": "DELETE"},
        lambda r: {**r, "raw_path": r["raw_path"] + "x"},
        lambda r: {**r, "raw_query": r["raw_query"].replace("prefix=a", "prefix=b")},
        lambda r: {**r, "raw_query": r["raw_query"] + "&extra=1"},
        lambda r: replace_header(r, "x-amz-meta-color", "red"),
        lambda r: replace_header(r, "host", "127.0.0.1:9001"),
        lambda r: replace_header(r, "x-amz-date", "20260101T120001Z"),
        lambda r: replace_header(r, "x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
        lambda r: replace_header(
            r,
            "authorization",
            r_header(r, "authorization")[:-1] + flip(r_header(r, "authorization")[-1]),
        ),
    ],
    ids=["method", "path", "query", "extra-query", "header", "host", "date", "payload", "sig"],
)
def test_tampering_breaks_the_signature(tamper):
    request = botocore_signed(
        "GET",
        ENDPOINT + "/bucket",
        params={"list-type": "2", "prefix": "a"},
        headers={"x-amz-meta-color": "blue"},
    )
    received = wire(request)
    verify(received)
    with pytest.raises(SignatureDoesNotMatch):
        verify(tamper(received))


def r_header(received: dict[str, object], name: str) -> str:
    return next(v for n, v in received["headers"] if n == name)


def flip(hex_digit: str) -> str:
    return "0" if hex_digit != "0" else "1"


def test_wrong_secret_is_a_mismatch():
    received = wire(botocore_signed("GET", ENDPOINT + "/bucket/key"))
    with pytest.raises(SignatureDoesNotMatch):
        verify(received, secrets={AKID: "not-the-secret"})


def test_unknown_access_key():
    received = wire(botocore_signed("GET", ENDPOINT + "/bucket/key"))
    with pytest.raises(InvalidAccessKeyId):
        verify(received, secrets={"SOMEONEELSE": SECRET})


@pytest.mark.parametrize("offset", [timedelta(minutes=16), -timedelta(minutes=16)])
def test_clock_skew(offset):
    received = wire(botocore_signed("GET", ENDPOINT + "/bucket/key"))
    verify(received, now=T0 + timedelta(minutes=14))
    with pytest.raises(RequestTimeTooSkewed):
        verify(received, now=T0 + offset)


def test_anonymous_request_is_denied():
    with pytest.raises(AccessDenied, match=r"(?i)anonymous"):
        verify({"method": "GET", "raw_path": "/b/k", "raw_query": "", "headers": [("host", "h")]})


def test_unsigned_amz_header_is_denied():
    received = wire(botocore_signed("PUT", ENDPOINT + "/bucket/key", body=b"x"))
    received["headers"] = [*received["headers"], ("x-amz-copy-source", "/other/secret")]
    with pytest.raises(AccessDenied, match="not signed: x-amz-copy-source"):
        verify(received)


def test_missing_content_sha256_on_a_body_is_refused():
    received = wire(botocore_signed("PUT", ENDPOINT + "/bucket/key", body=b"data"))
    received["headers"] = [(n, v) for n, v in received["headers"] if n != "x-amz-content-sha256"]
    with pytest.raises(InvalidRequest, match="x-amz-content-sha256"):
        verify(received)


def test_generic_sigv4_get_without_content_sha256_verifies():
    # What curl --aws-sigv4 (7.x) sends: plain SigV4, the empty body's hash, no header.
    request = AWSRequest(method="GET", url=ENDPOINT + "/bucket/key?b=2&a=1")
    SigV4Auth(BotoCredentials(AKID, SECRET), "s3", "us-east-1").add_auth(request)
    received = wire(request)
    assert not any(n == "x-amz-content-sha256" for n, _ in received["headers"])
    assert verify(received).payload_mode == "sha256"


def test_bad_content_sha256_value_is_refused():
    received = wire(botocore_signed("GET", ENDPOINT + "/bucket/key"))
    with pytest.raises(InvalidArgument):
        verify(replace_header(received, "x-amz-content-sha256", "not-a-hash"))


@pytest.mark.parametrize(
    ("authorization", "error"),
    [
        ("AWS4-HMAC-SHA256 garbage", AuthorizationHeaderMalformed),
        (
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260101/us-east-1/s3/aws4_request",
            AuthorizationHeaderMalformed,
        ),
        (
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260101/us-east-1/ec2/aws4_request, "
            f"SignedHeaders=host;x-amz-date, Signature={'0' * 64}",
            AuthorizationHeaderMalformed,
        ),
        (
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20251231/us-east-1/s3/aws4_request, "
            f"SignedHeaders=host;x-amz-date, Signature={'0' * 64}",
            AuthorizationHeaderMalformed,
        ),
        (
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260101/us-east-1/s3/aws4_request, "
            f"SignedHeaders=x-amz-date, Signature={'0' * 64}",
            AuthorizationHeaderMalformed,
        ),
        (
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260101/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;x-amz-date, Signature=xyz",
            AuthorizationHeaderMalformed,
        ),
        ("AWS AKIDEXAMPLE:c2lnbmF0dXJl", InvalidRequest),
    ],
)
def test_malformed_authorization(authorization, error):
    received = wire(botocore_signed("GET", ENDPOINT + "/bucket/key"))
    with pytest.raises(error):
        verify(replace_header(received, "authorization", authorization))


def test_any_region_is_accepted_as_scoped():
    request = AWSRequest(method="GET", url=ENDPOINT + "/bucket/key")
    S3SigV4Auth(BotoCredentials(AKID, SECRET), "s3", "ap-southeast-2").add_auth(request)
    assert verify(wire(request)).scope == "20260101/ap-southeast-2/s3/aws4_request"


def test_signing_key_is_the_documented_derivation():
    verified = verify(wire(botocore_signed("GET", ENDPOINT + "/bucket/key")))
    request = AWSRequest(method="GET", url=ENDPOINT + "/bucket/key")
    request.context["timestamp"] = "20260101T120000Z"
    signer = S3SigV4Auth(BotoCredentials(AKID, SECRET), "s3", "us-east-1")
    # botocore's signature() derives the key itself; both must sign alike.
    mine = hmac.new(verified.signing_key, b"probe", "sha256").hexdigest()
    assert signer.signature("probe", request) == mine


# --- verify_request: presigned URLs --------------------------------------------------------


def presigned(method: str = "GET", path: str = "/bucket/key", expires: int = 3600, **kw) -> dict:
    return wire(botocore_signed(method, ENDPOINT + path, presign=expires, **kw))


def test_verifies_botocore_presigned_urls():
    received = presigned(params={"response-content-type": "text/plain", "versionId": "a+b/c"})
    verified = verify(received, now=T0 + timedelta(minutes=30))
    assert verified.payload_mode == "unsigned"
    assert verified.payload_sha256 is None


@pytest.mark.parametrize("key", UNUSUAL_KEYS)
def test_verifies_presigned_put_of_unusual_keys(key):
    received = presigned("PUT", "/bucket/" + quote(key, safe="/~"))
    assert verify(received).payload_mode == "unsigned"


def test_verifies_boto3_generate_presigned_url():
    client = boto3.client(
        "s3",
        endpoint_url=ENDPOINT,
        region_name="us-east-1",
        aws_access_key_id=AKID,
        aws_secret_access_key=SECRET,
        config=Config(s3={"addressing_style": "path"}, signature_version="s3v4"),
    )
    for method, operation in [("GET", "get_object"), ("PUT", "put_object")]:
        url = client.generate_presigned_url(
            operation, Params={"Bucket": "b", "Key": "ü a+b"}, ExpiresIn=600
        )
        parts = urlsplit(url)
        verify(
            {
                "method": method,
                "raw_path": parts.path,
                "raw_query": parts.query,
                "headers": [("host", parts.netloc)],
            }
        )


def test_presigned_url_expires():
    received = presigned(expires=60)
    verify(received, now=T0 + timedelta(seconds=60))
    with pytest.raises(AccessDenied, match="Request has expired"):
        verify(received, now=T0 + timedelta(seconds=61))


def test_presigned_url_valid_for_zero_seconds_has_expired():
    # S3 (and SeaweedFS) answer 403 AccessDenied, not a malformed-query 400.
    received = presigned()
    received["raw_query"] = received["raw_query"].replace("X-Amz-Expires=3600", "X-Amz-Expires=0")
    with pytest.raises(AccessDenied, match="Request has expired"):
        verify(received, now=T0)


@pytest.mark.parametrize("expires", ["604801", "-5", "abc"])
def test_presigned_expiry_bounds(expires):
    received = presigned()
    received["raw_query"] = received["raw_query"].replace(
        "X-Amz-Expires=3600", f"X-Amz-Expires={expires}"
    )
    with pytest.raises(AuthorizationQueryParametersError):
        verify(received)


def test_presigned_url_from_the_future_is_refused():
    received = presigned()
    with pytest.raises(RequestTimeTooSkewed):
        verify(received, now=T0 - timedelta(hours=1))


@pytest.mark.parametrize(
    "tamper",
    [
        lambda q: q.replace("versionId=1", "versionId=2"),
        lambda q: q.replace("X-Amz-Expires=3600", "X-Amz-Expires=3601"),
        lambda q: q + "&x-id=GetObject",
    ],
)
def test_tampered_presigned_url(tamper):
    received = presigned(params={"versionId": "1"})
    verify(received)
    with pytest.raises(SignatureDoesNotMatch):
        verify({**received, "raw_query": tamper(received["raw_query"])})


def test_presigned_url_missing_parameter():
    received = presigned()
    query = "&".join(
        p for p in received["raw_query"].split("&") if not p.startswith("X-Amz-Signature")
    )
    with pytest.raises(AuthorizationQueryParametersError):
        verify({**received, "raw_query": query})


def test_presigned_payload_hash_from_header():
    received = presigned("PUT")
    received["headers"] = [*received["headers"], ("x-amz-content-sha256", "UNSIGNED-PAYLOAD")]
    assert verify(received).payload_mode == "unsigned"


def test_header_and_query_auth_together_is_refused():
    received = presigned()
    header = wire(botocore_signed("GET", ENDPOINT + "/bucket/key"))
    with pytest.raises(InvalidArgument):
        verify({**received, "headers": header["headers"]})


# --- sign_request ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "url", "headers", "body"),
    [
        ("GET", ENDPOINT + "/", {}, b""),
        ("GET", "https://s3.example.test/bucket?list-type=2&prefix=a%20b", {}, b""),
        ("PUT", ENDPOINT + "/bucket/a%20b%2Bc%3D~%C3%BC", {"content-type": "image/jpeg"}, b"img"),
        (
            "PUT",
            "http://[::1]:8333/bucket/key?partNumber=2&uploadId=abc%2Bdef",
            {"Content-MD5": "1B2M2Y8AsgTpgAmY7PhCfg==", "x-amz-meta-a": " spaced   out "},
            b"",
        ),
        ("POST", "https://s3.example.test:443/bucket/key?uploads", {"x-amz-acl": "private"}, b""),
        ("DELETE", "http://LOCALHOST:80/bucket/key?versionId=x~y", {"user-agent": "hapi"}, b""),
    ],
)
def test_sign_request_matches_botocore(method, url, headers, body):
    payload = botocore.auth.sha256(body).hexdigest()
    expected = botocore_signed(method, url, headers=dict(headers), body=body)
    signed = sign_request(
        method=method,
        url=url,
        headers=headers,
        credentials=Credentials(AKID, SECRET),
        payload_sha256=payload,
        now=T0,
    )
    assert signed["authorization"] == expected.headers["Authorization"]
    assert signed["x-amz-date"] == expected.headers["X-Amz-Date"]
    assert signed["x-amz-content-sha256"] == payload
    assert signed["host"] == botocore.auth._host_from_url(url)


def test_sign_request_unsigned_payload_matches_botocore():
    url = "https://s3.example.test/bucket/big"
    request = AWSRequest(method="PUT", url=url, data=io.BytesIO(b"x" * 10))
    request.context["client_config"] = Config(s3={"payload_signing_enabled": False})
    S3SigV4Auth(BotoCredentials(AKID, SECRET), "s3", "eu-central-1").add_auth(request)
    assert request.headers["X-Amz-Content-SHA256"] == "UNSIGNED-PAYLOAD"
    signed = sign_request(
        method="PUT",
        url=url,
        headers={},
        credentials=Credentials(AKID, SECRET),
        region="eu-central-1",
        now=T0.replace(tzinfo=None),
    )
    assert signed["authorization"] == request.headers["Authorization"]


def test_sign_request_replaces_a_stale_signature():
    stale = {"Authorization": "AWS4-HMAC-SHA256 old", "X-Amz-Date": "20000101T000000Z"}
    signed = sign_request(
        method="GET",
        url=ENDPOINT + "/b",
        headers=stale,
        credentials=Credentials(AKID, SECRET),
        now=T0,
    )
    assert set(signed) == {"host", "x-amz-date", "x-amz-content-sha256", "authorization"}
    assert signed["x-amz-date"] == "20260101T120000Z"


@pytest.mark.parametrize("key", UNUSUAL_KEYS)
def test_sign_then_verify_round_trip(key):
    query = _upstream_query("prefix=a+b&uploadId=x%2Fy")
    url = f"{ENDPOINT}/bucket/{quote(key, safe='/~')}?{query}"
    signed = sign_request(
        method="PUT",
        url=url,
        headers={"x-amz-meta-k": "v", "content-type": "a/b"},
        credentials=Credentials(AKID, SECRET),
        now=T0,
    )
    parts = urlsplit(url)
    verified = verify(
        {
            "method": "PUT",
            "raw_path": parts.path,
            "raw_query": parts.query,
            "headers": list(signed.items()),
        }
    )
    assert verified.payload_mode == "unsigned"
    assert "x-amz-meta-k" in verified.signed_headers


def _upstream_query(raw_query: str) -> str:
    """The query the gateway sends upstream for ``raw_query`` on an object's GET."""
    return parse_operation("GET", "/bkt/k", raw_query, [], ()).upstream_query()


def test_the_upstream_query_is_canonical_and_without_presign_parameters():
    assert _upstream_query("") == ""
    assert _upstream_query("tagging") == "tagging="
    assert _upstream_query("b=2&a=%7e&c=x+y%2f") == "a=~&b=2&c=x%20y%2F"
    presign = "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=ab&versionId=v&X-Amz-Expires=5"
    assert _upstream_query(presign) == "versionId=v"
