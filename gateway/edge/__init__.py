"""The S3 edge: everything an ordinary S3 request meets before and after the store.

Who signed a request (``_sigv4``, ``_sigv2``, form
policies in ``_post_policy``), its body as the client meant it (``_chunked``, ``_form``,
``_post_object``), the pass-through itself (``_proxy``), the lean upstream transport
(``_transport``) and the HTTP edge's limits under uvicorn (``_http``). Pushdown sits beside
it in :mod:`hapi.gateway.pushdown`; the two never import each other. The router above them
(:mod:`hapi.gateway._router`) parses each request once into the operation it is
(:mod:`hapi.gateway._operation`), decides, and hands it to one of them.
"""
