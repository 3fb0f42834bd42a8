"""Sources: the vendor backends, one package each (``nvidia``, ``amd``, ``intel``,
``apple``, ``fdinfo``), their shared contract (``base``) and guarded library call
(``calls``), the pure kernel parsers (``kernel``) and the DRM discovery they share.
Imports ``core`` only: a source knows nothing of the pipeline that runs it. The table of
backends an operator switches is exporter.pipeline.registry."""
