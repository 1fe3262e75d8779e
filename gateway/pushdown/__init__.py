"""Pushdown: a GET naming a model and a split answers features instead of the object.

A request's path through this subpackage, in order: its parameters (``_params``), the
split when it is ``auto`` (``_plan``, ``_profiles``), the model's blocks (``_tenants``,
``_registry``), the feature cache (``_cache``, ``_cached``), the objects and their samples
(``_fetch``), the storage-side batcher (``_batcher``) and the streamed answer (``_stream``).
``_handler`` ties them together; ``_resources`` owns what they share for the app's lifetime.
"""
