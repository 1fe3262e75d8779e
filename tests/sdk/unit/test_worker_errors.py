"""An SDK error raised in a DataLoader worker keeps its type in the main process."""

from __future__ import annotations

import pytest

from hapi import sdk

torch_utils = pytest.importorskip("torch._utils")

RAISED = [
    sdk.AccessDenied("AccessDenied", "no", bucket="b", key="k", status=403),
    sdk.RequestError("InternalError", "boom", bucket="b", status=500),
    sdk.NoSuchModel("NoSuchModel", "no such model r18", bucket="b"),
    sdk.NoSuchKey("NoSuchKey", "gone", bucket="b", key="k", status=404),
    sdk.UnprocessableObject("UnprocessableObject", "not an image", bucket="b", key="k"),
    sdk.InvalidArgument("InvalidArgument", "bad split", bucket="b"),
    sdk.SlowDown("SlowDown", "busy", bucket="b", status=503),
    sdk.EndpointsUnavailable({"http://a": "refused"}, attempts=3, bucket="b"),
    sdk.PushdownUnavailable("http://a", "no gateway header"),
    sdk.ModelUnavailable("cannot load"),
    sdk.LabelError("no label"),
    sdk.StateMismatch("the state was saved from another dataset: seed 1 (now 2)"),
]


@pytest.mark.parametrize("error", RAISED, ids=lambda e: type(e).__name__)
def test_an_error_re_raised_from_a_worker_keeps_its_type_and_text(error: Exception) -> None:
    try:
        raise error
    except Exception:  # what torch's worker loop does with whatever its dataset raised
        wrapper = torch_utils.ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(type(error)) as caught:
        wrapper.reraise()
    assert type(caught.value) is type(error)
    assert str(error) in str(caught.value)
