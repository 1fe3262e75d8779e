"""Helpers shared by the models' tests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn


def calibrated_net() -> list[nn.Module]:
    """Three conv+BatchNorm+ReLU blocks whose running statistics push activations to ~400.

    Like a network whose BatchNorm was calibrated on real photos: a small running variance
    scales every channel up, block after block.
    """
    import torch
    from torch import nn

    torch.manual_seed(0)
    blocks: list[nn.Module] = []
    channels = 3
    for _ in range(3):
        norm = nn.BatchNorm2d(32)
        with torch.no_grad():
            norm.running_var.fill_(1e-2)
            norm.running_mean.uniform_(-0.1, 0.1)
        blocks.append(nn.Sequential(nn.Conv2d(channels, 32, 3, 2, 1), norm, nn.ReLU()))
        channels = 32
    return blocks


class RecordingClient:
    """A boto3 client proxy that records (operation, key) of every call it forwards."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: list[tuple[str, str | None]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name in {"meta", "get_paginator"} or not callable(attr):
            return attr

        def call(**kwargs: Any) -> Any:
            self.calls.append((name, kwargs.get("Key")))
            return attr(**kwargs)

        return call
