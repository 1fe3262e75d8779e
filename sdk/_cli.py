"""``hapi demo``: the transfer-learning example, from the installed package."""

from __future__ import annotations

import click


@click.command(
    context_settings={
        "ignore_unknown_options": True,
        "allow_extra_args": True,
        "help_option_names": [],
    }
)
@click.pass_context
def demo(ctx: click.Context) -> None:
    """Train a linear head on EfficientNet-Lite0 features of digits stored in S3.

    Uploads scikit-learn's digits as JPEGs through the gateway, trains through
    sdk.FeatureDataset, prints accuracy, the split and why, bytes and time. Options:
    `hapi demo --help`. Needs the gateway's endpoint and credentials in the environment
    (what `hapi up` prints) or --endpoint.
    """
    from ._demo import main

    main(list(ctx.args))
