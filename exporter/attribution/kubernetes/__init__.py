"""Kubernetes pod attribution: which pod holds each GPU, and which pod each GPU process is in.

- ``podresources``: the kubelet pod-resources API v1 client (device -> container,
  DRA claims -> container);
- ``cdi``: CDI spec files (a claim's CDI device name -> device nodes);
- ``dra``: a claimed device's nodes -> our GPU (NVML minor, DRM node -> PCI bus id);
- ``cri``: the CRI runtime client (container id -> pod, namespace, container name, UID);
- ``podlabels``: ``--kubernetes.pod-labels``, pod sandbox labels -> a join series;
- ``cgroup``: ``/proc/<pid>/cgroup`` -> container id and pod UID;
- ``attribution``: device-plugin id formats, and the immutable Enricher;
- ``unallocated``: processes on a GPU their pod was not given, or in no pod;
- ``backend``: the ``kubernetes`` backend that refreshes it all on its own tier.

grpcio and protobuf are imported only when a client is created (``rpc``), so importing
this package costs nothing on a machine without Kubernetes. docs/kubernetes.md is the
operator's side.
"""
