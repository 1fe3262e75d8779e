"""Transfer learning on features: a linear head on EfficientNet-Lite0, the data in S3.

The same program as ``hapi demo`` (its code is ``hapi.sdk._demo``, read it for the
training loop: ordinary PyTorch, only the dataset is hapi's). With the environment that
``make run`` prints::

    .venv/bin/python examples/transfer_learning.py [--split auto|none|K] [--dtype float16]
"""

from hapi.sdk._demo import main

if __name__ == "__main__":
    main()
