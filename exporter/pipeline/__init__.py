"""The pipeline: the hub that runs the sources and publishes snapshots (``hub``,
``hubstate``, ``state``), the backend table (``registry``), the merge of every source's
view of a GPU, the energy split and the health verdicts. Imports ``core``, ``sources``
and ``attribution``; knows nothing of exposition."""
