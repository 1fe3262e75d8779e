"""Which decoder turns a pushdown's images into model inputs: Pillow, or NVIDIA DALI.

The decoder is part of the preset a request is served with (``Preset.decoder``), so it is
part of every cache key: features decoded by Pillow and by DALI never answer for each other.
"""

from __future__ import annotations

import dataclasses
import os
import threading

from ...models import DaliDecoder, Manifest, Preset, cuda_usable, dali_available
from .._settings import GatewaySettings

_INSTALL = "pip install 'hapi[gpu-decode]'"


def chosen_decoder(settings: GatewaySettings) -> str:
    """The decoder ``settings.decoder`` names; ``auto`` is ``dali-gpu`` where the blocks
    run on a usable CUDA device and DALI is installed, else ``pil``.

    Raises:
        ValueError: DALI is named but not installed, or ``dali-gpu`` without a usable GPU.
    """
    name = settings.decoder
    if name == "auto":
        on_gpu = settings.device != "cpu" and cuda_usable()
        return "dali-gpu" if on_gpu and dali_available() else "pil"
    if name.startswith("dali-") and not dali_available():
        raise ValueError(f"decoder {name} needs NVIDIA DALI: {_INSTALL}")
    if name == "dali-gpu" and not cuda_usable():
        raise ValueError("decoder dali-gpu needs a usable CUDA GPU (dali-cpu runs without one)")
    return name


class Decoding:
    """The gateway's decoder: the presets it serves, and one DALI pipeline per preset."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.name = chosen_decoder(settings)
        self._threads = settings.decode_workers or os.cpu_count() or 1
        self._served: dict[str, tuple[Manifest, Manifest]] = {}
        self._pipelines: dict[Preset, DaliDecoder] = {}
        self._lock = threading.Lock()

    def served(self, manifest: Manifest) -> Manifest:
        """``manifest`` with its preset naming this gateway's decoder."""
        if self.name == manifest.preprocess.decoder:
            return manifest
        known = self._served.get(manifest.ref)
        if known is not None and known[0] is manifest:
            return known[1]
        preset = dataclasses.replace(manifest.preprocess, decoder=self.name)
        served = dataclasses.replace(manifest, preprocess=preset)
        self._served[manifest.ref] = (manifest, served)
        return served

    def batch_decoder(self, preset: Preset) -> DaliDecoder:
        """The DALI pipeline for ``preset`` (built at its first use)."""
        with self._lock:
            found = self._pipelines.get(preset)
            if found is None:
                on_gpu = preset.decoder == "dali-gpu"
                found = DaliDecoder(
                    preset, device="gpu" if on_gpu else "cpu", threads=self._threads
                )
                self._pipelines[preset] = found
            return found
