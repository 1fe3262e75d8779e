"""The S3 edge: everything an ordinary S3 request meets before and after the store.

Where a request points (``_addressing``), who signed it (``_sigv4``, ``_sigv2``, form
policies in ``_post_policy``), its body as the client meant it (``_chunked``, ``_form``,
``_post_object``), the pass-through itself (``_proxy``), the lean upstream transport
(``_transport``) and the HTTP edge's limits under uvicorn (``_http``). Pushdown sits beside
it in :mod:`hapi.gateway.pushdown`; the proxy hands it the requests that name a model.
"""
