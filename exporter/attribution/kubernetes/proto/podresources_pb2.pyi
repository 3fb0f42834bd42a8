from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AllocatableResourcesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AllocatableResourcesResponse(_message.Message):
    __slots__ = ("devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[ContainerDevices]
    def __init__(self, devices: _Optional[_Iterable[_Union[ContainerDevices, _Mapping]]] = ...) -> None: ...

class ListPodResourcesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPodResourcesResponse(_message.Message):
    __slots__ = ("pod_resources",)
    POD_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    pod_resources: _containers.RepeatedCompositeFieldContainer[PodResources]
    def __init__(self, pod_resources: _Optional[_Iterable[_Union[PodResources, _Mapping]]] = ...) -> None: ...

class PodResources(_message.Message):
    __slots__ = ("name", "namespace", "containers")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    namespace: str
    containers: _containers.RepeatedCompositeFieldContainer[ContainerResources]
    def __init__(self, name: _Optional[str] = ..., namespace: _Optional[str] = ..., containers: _Optional[_Iterable[_Union[ContainerResources, _Mapping]]] = ...) -> None: ...

class ContainerResources(_message.Message):
    __slots__ = ("name", "devices", "dynamic_resources")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    DYNAMIC_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    name: str
    devices: _containers.RepeatedCompositeFieldContainer[ContainerDevices]
    dynamic_resources: _containers.RepeatedCompositeFieldContainer[DynamicResource]
    def __init__(self, name: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[ContainerDevices, _Mapping]]] = ..., dynamic_resources: _Optional[_Iterable[_Union[DynamicResource, _Mapping]]] = ...) -> None: ...

class DynamicResource(_message.Message):
    __slots__ = ("claim_name", "claim_namespace", "claim_resources")
    CLAIM_NAME_FIELD_NUMBER: _ClassVar[int]
    CLAIM_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CLAIM_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    claim_name: str
    claim_namespace: str
    claim_resources: _containers.RepeatedCompositeFieldContainer[ClaimResource]
    def __init__(self, claim_name: _Optional[str] = ..., claim_namespace: _Optional[str] = ..., claim_resources: _Optional[_Iterable[_Union[ClaimResource, _Mapping]]] = ...) -> None: ...

class ClaimResource(_message.Message):
    __slots__ = ("cdi_devices", "driver_name", "pool_name", "device_name")
    CDI_DEVICES_FIELD_NUMBER: _ClassVar[int]
    DRIVER_NAME_FIELD_NUMBER: _ClassVar[int]
    POOL_NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    cdi_devices: _containers.RepeatedCompositeFieldContainer[CDIDevice]
    driver_name: str
    pool_name: str
    device_name: str
    def __init__(self, cdi_devices: _Optional[_Iterable[_Union[CDIDevice, _Mapping]]] = ..., driver_name: _Optional[str] = ..., pool_name: _Optional[str] = ..., device_name: _Optional[str] = ...) -> None: ...

class CDIDevice(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ContainerDevices(_message.Message):
    __slots__ = ("resource_name", "device_ids")
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IDS_FIELD_NUMBER: _ClassVar[int]
    resource_name: str
    device_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, resource_name: _Optional[str] = ..., device_ids: _Optional[_Iterable[str]] = ...) -> None: ...
