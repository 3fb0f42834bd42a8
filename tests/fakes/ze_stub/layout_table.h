/* Every struct and field the exporter declares in exporter/backends/ze_calls.py, as an
 * X-macro: STRUCT(type) then FIELD(type, member). Compiled into the stub (against
 * ze_types.h) and into layout_real.c (against the real <level_zero/zes_api.h>) so the
 * tests compare sizeof/offsetof from the C compiler with ctypes. Keep in step with
 * ze_calls.STRUCTS: the test fails if a field is missing here. */
#define ZE_LAYOUT_TABLE(STRUCT, FIELD) \
    STRUCT(ze_device_properties_t) \
    FIELD(ze_device_properties_t, stype) \
    FIELD(ze_device_properties_t, pNext) \
    FIELD(ze_device_properties_t, type) \
    FIELD(ze_device_properties_t, vendorId) \
    FIELD(ze_device_properties_t, deviceId) \
    FIELD(ze_device_properties_t, flags) \
    FIELD(ze_device_properties_t, subdeviceId) \
    FIELD(ze_device_properties_t, coreClockRate) \
    FIELD(ze_device_properties_t, maxMemAllocSize) \
    FIELD(ze_device_properties_t, maxHardwareContexts) \
    FIELD(ze_device_properties_t, maxCommandQueuePriority) \
    FIELD(ze_device_properties_t, numThreadsPerEU) \
    FIELD(ze_device_properties_t, physicalEUSimdWidth) \
    FIELD(ze_device_properties_t, numEUsPerSubslice) \
    FIELD(ze_device_properties_t, numSubslicesPerSlice) \
    FIELD(ze_device_properties_t, numSlices) \
    FIELD(ze_device_properties_t, timerResolution) \
    FIELD(ze_device_properties_t, timestampValidBits) \
    FIELD(ze_device_properties_t, kernelTimestampValidBits) \
    FIELD(ze_device_properties_t, uuid) \
    FIELD(ze_device_properties_t, name) \
    STRUCT(zes_device_properties_t) \
    FIELD(zes_device_properties_t, stype) \
    FIELD(zes_device_properties_t, pNext) \
    FIELD(zes_device_properties_t, core) \
    FIELD(zes_device_properties_t, numSubdevices) \
    FIELD(zes_device_properties_t, serialNumber) \
    FIELD(zes_device_properties_t, boardNumber) \
    FIELD(zes_device_properties_t, brandName) \
    FIELD(zes_device_properties_t, modelName) \
    FIELD(zes_device_properties_t, vendorName) \
    FIELD(zes_device_properties_t, driverVersion) \
    STRUCT(zes_pci_address_t) \
    FIELD(zes_pci_address_t, domain) \
    FIELD(zes_pci_address_t, bus) \
    FIELD(zes_pci_address_t, device) \
    FIELD(zes_pci_address_t, function) \
    STRUCT(zes_pci_speed_t) \
    FIELD(zes_pci_speed_t, gen) \
    FIELD(zes_pci_speed_t, width) \
    FIELD(zes_pci_speed_t, maxBandwidth) \
    STRUCT(zes_pci_properties_t) \
    FIELD(zes_pci_properties_t, stype) \
    FIELD(zes_pci_properties_t, pNext) \
    FIELD(zes_pci_properties_t, address) \
    FIELD(zes_pci_properties_t, maxSpeed) \
    FIELD(zes_pci_properties_t, haveBandwidthCounters) \
    FIELD(zes_pci_properties_t, havePacketCounters) \
    FIELD(zes_pci_properties_t, haveReplayCounters) \
    STRUCT(zes_engine_properties_t) \
    FIELD(zes_engine_properties_t, stype) \
    FIELD(zes_engine_properties_t, pNext) \
    FIELD(zes_engine_properties_t, type) \
    FIELD(zes_engine_properties_t, onSubdevice) \
    FIELD(zes_engine_properties_t, subdeviceId) \
    STRUCT(zes_engine_stats_t) \
    FIELD(zes_engine_stats_t, activeTime) \
    FIELD(zes_engine_stats_t, timestamp) \
    STRUCT(zes_mem_properties_t) \
    FIELD(zes_mem_properties_t, stype) \
    FIELD(zes_mem_properties_t, pNext) \
    FIELD(zes_mem_properties_t, type) \
    FIELD(zes_mem_properties_t, onSubdevice) \
    FIELD(zes_mem_properties_t, subdeviceId) \
    FIELD(zes_mem_properties_t, location) \
    FIELD(zes_mem_properties_t, physicalSize) \
    FIELD(zes_mem_properties_t, busWidth) \
    FIELD(zes_mem_properties_t, numChannels) \
    STRUCT(zes_mem_state_t) \
    FIELD(zes_mem_state_t, stype) \
    FIELD(zes_mem_state_t, pNext) \
    FIELD(zes_mem_state_t, health) \
    FIELD(zes_mem_state_t, free) \
    FIELD(zes_mem_state_t, size) \
    STRUCT(zes_mem_bandwidth_t) \
    FIELD(zes_mem_bandwidth_t, readCounter) \
    FIELD(zes_mem_bandwidth_t, writeCounter) \
    FIELD(zes_mem_bandwidth_t, maxBandwidth) \
    FIELD(zes_mem_bandwidth_t, timestamp) \
    STRUCT(zes_power_properties_t) \
    FIELD(zes_power_properties_t, stype) \
    FIELD(zes_power_properties_t, pNext) \
    FIELD(zes_power_properties_t, onSubdevice) \
    FIELD(zes_power_properties_t, subdeviceId) \
    FIELD(zes_power_properties_t, canControl) \
    FIELD(zes_power_properties_t, isEnergyThresholdSupported) \
    FIELD(zes_power_properties_t, defaultLimit) \
    FIELD(zes_power_properties_t, minLimit) \
    FIELD(zes_power_properties_t, maxLimit) \
    STRUCT(zes_power_energy_counter_t) \
    FIELD(zes_power_energy_counter_t, energy) \
    FIELD(zes_power_energy_counter_t, timestamp) \
    STRUCT(zes_temp_properties_t) \
    FIELD(zes_temp_properties_t, stype) \
    FIELD(zes_temp_properties_t, pNext) \
    FIELD(zes_temp_properties_t, type) \
    FIELD(zes_temp_properties_t, onSubdevice) \
    FIELD(zes_temp_properties_t, subdeviceId) \
    FIELD(zes_temp_properties_t, maxTemperature) \
    FIELD(zes_temp_properties_t, isCriticalTempSupported) \
    FIELD(zes_temp_properties_t, isThreshold1Supported) \
    FIELD(zes_temp_properties_t, isThreshold2Supported) \
    STRUCT(zes_freq_properties_t) \
    FIELD(zes_freq_properties_t, stype) \
    FIELD(zes_freq_properties_t, pNext) \
    FIELD(zes_freq_properties_t, type) \
    FIELD(zes_freq_properties_t, onSubdevice) \
    FIELD(zes_freq_properties_t, subdeviceId) \
    FIELD(zes_freq_properties_t, canControl) \
    FIELD(zes_freq_properties_t, isThrottleEventSupported) \
    FIELD(zes_freq_properties_t, min) \
    FIELD(zes_freq_properties_t, max) \
    STRUCT(zes_freq_state_t) \
    FIELD(zes_freq_state_t, stype) \
    FIELD(zes_freq_state_t, pNext) \
    FIELD(zes_freq_state_t, currentVoltage) \
    FIELD(zes_freq_state_t, request) \
    FIELD(zes_freq_state_t, tdp) \
    FIELD(zes_freq_state_t, efficient) \
    FIELD(zes_freq_state_t, actual) \
    FIELD(zes_freq_state_t, throttleReasons) \
    STRUCT(zes_ras_properties_t) \
    FIELD(zes_ras_properties_t, stype) \
    FIELD(zes_ras_properties_t, pNext) \
    FIELD(zes_ras_properties_t, type) \
    FIELD(zes_ras_properties_t, onSubdevice) \
    FIELD(zes_ras_properties_t, subdeviceId) \
    STRUCT(zes_ras_state_t) \
    FIELD(zes_ras_state_t, stype) \
    FIELD(zes_ras_state_t, pNext) \
    FIELD(zes_ras_state_t, category) \
    STRUCT(zes_process_state_t) \
    FIELD(zes_process_state_t, stype) \
    FIELD(zes_process_state_t, pNext) \
    FIELD(zes_process_state_t, processId) \
    FIELD(zes_process_state_t, memSize) \
    FIELD(zes_process_state_t, sharedSize) \
    FIELD(zes_process_state_t, engines) \
    /* end */
