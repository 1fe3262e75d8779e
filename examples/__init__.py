"""hapi.examples: programs that show hapi at work, written against the public API only.

``transfer_learning`` is also ``hapi demo``: one copy of the code, run either way.
"""
