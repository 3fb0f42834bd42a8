/* The stub's own C declarations of the Level Zero Sysman types it serves: written from
 * the public spec (zes_api.h / ze_api.h v1.4-r1.4.8; zesInit/zesDriverGet/zesDeviceGet
 * from v1.15-r1.15.31), with the spec's type names so that layout_table.h compiles
 * against these and against the real <level_zero/zes_api.h> alike. */
#ifndef ZE_STUB_TYPES_H
#define ZE_STUB_TYPES_H
#include <stdint.h>

typedef uint32_t ze_result_t;
typedef uint8_t ze_bool_t;
typedef uint32_t zes_structure_type_t;
typedef void *zes_driver_handle_t, *zes_device_handle_t, *zes_engine_handle_t,
    *zes_mem_handle_t, *zes_pwr_handle_t, *zes_temp_handle_t, *zes_freq_handle_t,
    *zes_ras_handle_t;

typedef struct { uint8_t id[16]; } ze_device_uuid_t;

typedef struct {
    uint32_t stype; void *pNext; uint32_t type; uint32_t vendorId; uint32_t deviceId;
    uint32_t flags; uint32_t subdeviceId; uint32_t coreClockRate; uint64_t maxMemAllocSize;
    uint32_t maxHardwareContexts; uint32_t maxCommandQueuePriority; uint32_t numThreadsPerEU;
    uint32_t physicalEUSimdWidth; uint32_t numEUsPerSubslice; uint32_t numSubslicesPerSlice;
    uint32_t numSlices; uint64_t timerResolution; uint32_t timestampValidBits;
    uint32_t kernelTimestampValidBits; ze_device_uuid_t uuid; char name[256];
} ze_device_properties_t;

typedef struct {
    zes_structure_type_t stype; void *pNext; ze_device_properties_t core;
    uint32_t numSubdevices; char serialNumber[64]; char boardNumber[64]; char brandName[64];
    char modelName[64]; char vendorName[64]; char driverVersion[64];
} zes_device_properties_t;

typedef struct { uint32_t domain, bus, device, function; } zes_pci_address_t;
typedef struct { int32_t gen; int32_t width; int64_t maxBandwidth; } zes_pci_speed_t;
typedef struct {
    zes_structure_type_t stype; void *pNext; zes_pci_address_t address;
    zes_pci_speed_t maxSpeed; ze_bool_t haveBandwidthCounters, havePacketCounters,
    haveReplayCounters;
} zes_pci_properties_t;

typedef struct {
    zes_structure_type_t stype; void *pNext; uint32_t type; ze_bool_t onSubdevice;
    uint32_t subdeviceId;
} zes_engine_properties_t;
typedef struct { uint64_t activeTime; uint64_t timestamp; } zes_engine_stats_t;

typedef struct {
    zes_structure_type_t stype; void *pNext; uint32_t type; ze_bool_t onSubdevice;
    uint32_t subdeviceId; uint32_t location; uint64_t physicalSize; int32_t busWidth;
    int32_t numChannels;
} zes_mem_properties_t;
typedef struct {
    zes_structure_type_t stype; const void *pNext; uint32_t health; uint64_t free;
    uint64_t size;
} zes_mem_state_t;
typedef struct {
    uint64_t readCounter, writeCounter, maxBandwidth, timestamp;
} zes_mem_bandwidth_t;

typedef struct {
    zes_structure_type_t stype; void *pNext; ze_bool_t onSubdevice; uint32_t subdeviceId;
    ze_bool_t canControl; ze_bool_t isEnergyThresholdSupported; int32_t defaultLimit;
    int32_t minLimit; int32_t maxLimit;
} zes_power_properties_t;
typedef struct { uint64_t energy; uint64_t timestamp; } zes_power_energy_counter_t;

typedef struct {
    zes_structure_type_t stype; void *pNext; uint32_t type; ze_bool_t onSubdevice;
    uint32_t subdeviceId; double maxTemperature; ze_bool_t isCriticalTempSupported,
    isThreshold1Supported, isThreshold2Supported;
} zes_temp_properties_t;

typedef struct {
    zes_structure_type_t stype; void *pNext; uint32_t type; ze_bool_t onSubdevice;
    uint32_t subdeviceId; ze_bool_t canControl; ze_bool_t isThrottleEventSupported;
    double min; double max;
} zes_freq_properties_t;
typedef struct {
    zes_structure_type_t stype; const void *pNext; double currentVoltage; double request;
    double tdp; double efficient; double actual; uint32_t throttleReasons;
} zes_freq_state_t;

typedef struct {
    zes_structure_type_t stype; void *pNext; uint32_t type; ze_bool_t onSubdevice;
    uint32_t subdeviceId;
} zes_ras_properties_t;
typedef struct {
    zes_structure_type_t stype; const void *pNext; uint64_t category[7];
} zes_ras_state_t;

typedef struct {
    zes_structure_type_t stype; const void *pNext; uint32_t processId; uint64_t memSize;
    uint64_t sharedSize; uint32_t engines;
} zes_process_state_t;

#endif
