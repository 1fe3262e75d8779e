"""``hapi demo``: ``examples/transfer_learning.py`` (``hapi.examples``), run by name."""

from __future__ import annotations

import click

from hapi.models.cli import UserError


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

    The program is examples/transfer_learning.py. Uploads scikit-learn's digits as JPEGs
    through the gateway, trains through sdk.FeatureDataset, prints the split, the
    accuracy, the bytes received against the raw images, and the time. Options:
    `hapi demo --help`. Needs the gateway's endpoint and credentials in the environment
    (what `hapi up` prints) or --endpoint, and `pip install 'hapi[demo]'`.
    """
    try:
        from hapi.examples.transfer_learning import main
    except ImportError as exc:
        raise UserError(
            f"hapi demo needs {exc.name or 'more packages'}: pip install 'hapi[demo]'"
        ) from exc
    main(list(ctx.args), prog="hapi demo")
