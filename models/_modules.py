"""Small torch modules that cut networks whose ``forward`` is not a plain chain.

Imported only by the family builders, which run only at export time: this is the one
module of ``hapi.models`` that imports torch at module level.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class VitEmbedding(nn.Module):
    """ViT's patch embedding, class token and position embedding: ``NCHW -> (N, S, D)``.

    Mirrors ``torchvision.models.VisionTransformer._process_input`` and the first lines of
    ``Encoder.forward``, without the ``torch._assert`` calls that do not trace.
    """

    def __init__(self, vit: Any) -> None:
        super().__init__()
        self.conv_proj: nn.Module = vit.conv_proj
        self.class_token: nn.Parameter = vit.class_token
        self.pos_embedding: nn.Parameter = vit.encoder.pos_embedding
        self.dropout: nn.Module = vit.encoder.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = self.conv_proj(x).flatten(2).transpose(1, 2)
        token = self.class_token.expand(patches.shape[0], -1, -1)
        embedded: torch.Tensor = self.dropout(
            torch.cat([token, patches], dim=1) + self.pos_embedding
        )
        return embedded


class ClassToken(nn.Module):
    """ViT's final layer norm followed by taking the class token: ``(N, S, D) -> (N, D)``."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed: torch.Tensor = self.norm(x)
        return normed[:, 0]
