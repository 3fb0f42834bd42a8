/* A stand-in for the Level Zero loader (libze_loader.so.1) with the Sysman symbols the
 * exporter uses, for tests on machines without an Intel GPU. Built by the test run with
 * `cc -shared -fPIC`; the exporter loads it through the same ctypes path as the real one.
 *
 * What it answers comes from a tab-separated file named by ZE_STUB_DATA, read on every
 * zesInit (see tests/fixtures/intel-xe-b580/level_zero.tsv and its SOURCES note):
 *   device  domain bus dev fn deviceId modelName serial driverVersion
 *   engine  group activeTime_us timestamp_us activeStep_us timestampStep_us
 *   memory  location physicalSize size free read write readStep writeStep ts_us tsStep_us
 *   power   onSubdevice energy_uJ ts_us energyStep_uJ tsStep_us
 *   temp    type celsius
 *   freq    type min_MHz max_MHz request_MHz actual_MHz throttleReasons
 *   ras     type reset programming driver compute non_compute cache display
 *   process pid memSize sharedSize engines
 *   unsupported functionName     (that call answers ZE_RESULT_ERROR_UNSUPPORTED_FEATURE)
 *   denied functionName          (that call answers ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS)
 * Component lines belong to the device above them. Counters advance by their step on
 * every read, so a test knows each reading: base + n * step.
 *
 * Test controls (not part of Level Zero): zeStubSetInitResult, zeStubSetLost,
 * zeStubSetHang, zeStubCalls, zeStubLayout. Built with -DZE_STUB_NO_ZESINIT it lacks
 * zesInit, like loaders older than spec 1.5 (Debian 12's libze1 1.8).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <time.h>

#include "ze_types.h"
#include "layout_table.h"

#define OK 0u
#define DEVICE_LOST 0x70000001u
#define UNINITIALIZED 0x78000001u
#define UNSUPPORTED 0x78000003u
#define INVALID_ARGUMENT 0x78000004u
#define MAXN 16

typedef struct { uint32_t group; uint64_t active, ts, active_step, ts_step, n; } engine_t;
typedef struct {
    uint32_t location; uint64_t physical, size, free, rd, wr, rd_step, wr_step, ts, ts_step, n;
} memory_t;
typedef struct { uint32_t on_sub; uint64_t energy, ts, energy_step, ts_step, n; } power_t;
typedef struct { uint32_t type; double celsius; } temp_t;
typedef struct { uint32_t type; double min, max, request, actual; uint32_t throttle; } freq_t;
typedef struct { uint32_t type; uint64_t category[7]; } ras_t;
typedef struct { uint32_t pid; uint64_t mem, shared; uint32_t engines; } proc_t;

typedef struct {
    uint32_t domain, bus, dev, fn, device_id;
    char model[64], serial[64], driver[64];
    engine_t engines[MAXN]; uint32_t n_engines;
    memory_t memory[MAXN]; uint32_t n_memory;
    power_t power[MAXN]; uint32_t n_power;
    temp_t temps[MAXN]; uint32_t n_temps;
    freq_t freqs[MAXN]; uint32_t n_freqs;
    ras_t ras[MAXN]; uint32_t n_ras;
    proc_t procs[64]; uint32_t n_procs;
    char unsupported[MAXN][64]; uint32_t n_unsupported;
    char denied[MAXN][64]; uint32_t n_denied;
    int lost;
} device_t;

static device_t devices[MAXN];
static uint32_t n_devices;
static int initialised;
static uint32_t init_result = OK;
static volatile int hang;
static int driver_token;
static uint32_t calls[32];

enum { C_INIT, C_ENGINE_ACTIVITY, C_MEMORY_STATE, C_MEMORY_BANDWIDTH, C_ENERGY, C_TEMP,
       C_FREQ, C_RAS, C_PROCESSES, C_PCI, C_COUNT };
static const char *call_names[C_COUNT] = {
    "zesInit", "zesEngineGetActivity", "zesMemoryGetState", "zesMemoryGetBandwidth",
    "zesPowerGetEnergyCounter", "zesTemperatureGetState", "zesFrequencyGetState",
    "zesRasGetState", "zesDeviceProcessesGetState", "zesDevicePciGetProperties"};

static uint64_t u64(const char *s) { return s ? strtoull(s, NULL, 10) : 0; }
static double dbl(const char *s) { return s ? strtod(s, NULL) : 0.0; }
static void copy(char *dst, const char *src) {
    snprintf(dst, 64, "%s", src ? src : "");
}

static __attribute__((unused)) void load(const char *path) {
    n_devices = 0;
    memset(devices, 0, sizeof devices);
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return;
    char line[1024];
    device_t *d = NULL;
    while (fgets(line, sizeof line, f)) {
        char *save = NULL, *tok[16] = {0};
        int n = 0;
        for (char *t = strtok_r(line, "\t\n", &save); t && n < 16; t = strtok_r(NULL, "\t\n", &save))
            tok[n++] = t;
        if (n == 0 || tok[0][0] == '#') continue;
        if (!strcmp(tok[0], "device") && n_devices < MAXN) {
            d = &devices[n_devices++];
            d->domain = u64(tok[1]); d->bus = strtoul(tok[2], NULL, 16);
            d->dev = strtoul(tok[3], NULL, 16); d->fn = u64(tok[4]);
            d->device_id = strtoul(tok[5], NULL, 16);
            copy(d->model, tok[6]); copy(d->serial, tok[7]); copy(d->driver, tok[8]);
        } else if (!d) {
            continue;
        } else if (!strcmp(tok[0], "engine") && d->n_engines < MAXN) {
            engine_t *e = &d->engines[d->n_engines++];
            e->group = u64(tok[1]); e->active = u64(tok[2]); e->ts = u64(tok[3]);
            e->active_step = u64(tok[4]); e->ts_step = u64(tok[5]);
        } else if (!strcmp(tok[0], "memory") && d->n_memory < MAXN) {
            memory_t *m = &d->memory[d->n_memory++];
            m->location = u64(tok[1]); m->physical = u64(tok[2]); m->size = u64(tok[3]);
            m->free = u64(tok[4]); m->rd = u64(tok[5]); m->wr = u64(tok[6]);
            m->rd_step = u64(tok[7]); m->wr_step = u64(tok[8]); m->ts = u64(tok[9]);
            m->ts_step = u64(tok[10]);
        } else if (!strcmp(tok[0], "power") && d->n_power < MAXN) {
            power_t *p = &d->power[d->n_power++];
            p->on_sub = u64(tok[1]); p->energy = u64(tok[2]); p->ts = u64(tok[3]);
            p->energy_step = u64(tok[4]); p->ts_step = u64(tok[5]);
        } else if (!strcmp(tok[0], "temp") && d->n_temps < MAXN) {
            temp_t *t = &d->temps[d->n_temps++];
            t->type = u64(tok[1]); t->celsius = dbl(tok[2]);
        } else if (!strcmp(tok[0], "freq") && d->n_freqs < MAXN) {
            freq_t *q = &d->freqs[d->n_freqs++];
            q->type = u64(tok[1]); q->min = dbl(tok[2]); q->max = dbl(tok[3]);
            q->request = dbl(tok[4]); q->actual = dbl(tok[5]); q->throttle = u64(tok[6]);
        } else if (!strcmp(tok[0], "ras") && d->n_ras < MAXN) {
            ras_t *r = &d->ras[d->n_ras++];
            r->type = u64(tok[1]);
            for (int i = 0; i < 7; i++) r->category[i] = u64(tok[2 + i]);
        } else if (!strcmp(tok[0], "process") && d->n_procs < 64) {
            proc_t *p = &d->procs[d->n_procs++];
            p->pid = u64(tok[1]); p->mem = u64(tok[2]); p->shared = u64(tok[3]);
            p->engines = u64(tok[4]);
        } else if (!strcmp(tok[0], "unsupported") && d->n_unsupported < MAXN) {
            copy(d->unsupported[d->n_unsupported++], tok[1]);
        } else if (!strcmp(tok[0], "denied") && d->n_denied < MAXN) {
            copy(d->denied[d->n_denied++], tok[1]);
        }
    }
    fclose(f);
}

/* Which device a handle (the device itself or one of its components) belongs to. */
static device_t *owner(const void *h) {
    for (uint32_t i = 0; i < n_devices; i++)
        if ((const char *)h >= (const char *)&devices[i] &&
            (const char *)h < (const char *)&devices[i] + sizeof(device_t))
            return &devices[i];
    return NULL;
}

/* Common checks of every device-level call: initialised, handle known, not lost,
 * not declared unsupported in the data file. */
static ze_result_t check(const void *h, const char *fn) {
    if (!initialised) return UNINITIALIZED;
    device_t *d = owner(h);
    if (!d) return INVALID_ARGUMENT;
    if (d->lost) return DEVICE_LOST;
    for (uint32_t i = 0; i < d->n_unsupported; i++)
        if (!strcmp(d->unsupported[i], fn)) return UNSUPPORTED;
    for (uint32_t i = 0; i < d->n_denied; i++)
        if (!strcmp(d->denied[i], fn)) return 0x70010000u; /* INSUFFICIENT_PERMISSIONS */
    return OK;
}

#define CHECK(h)                                           \
    do {                                                   \
        ze_result_t r_ = check((h), __func__);             \
        if (r_ != OK) return r_;                           \
    } while (0)

static ze_result_t list(uint32_t *count, void **out, void *base, size_t size, uint32_t n) {
    if (!count) return INVALID_ARGUMENT;
    if (*count == 0 || !out) { *count = n; return OK; }
    if (*count > n) *count = n;
    for (uint32_t i = 0; i < *count; i++) out[i] = (char *)base + i * size;
    return OK;
}

#ifndef ZE_STUB_NO_ZESINIT
ze_result_t zesInit(uint32_t flags) {
    calls[C_INIT]++;
    if (flags > 1) return 0x7800000cu; /* ZE_RESULT_ERROR_INVALID_ENUMERATION */
    if (init_result != OK) return init_result;
    load(getenv("ZE_STUB_DATA"));
    initialised = 1;
    return OK;
}
#endif

ze_result_t zesDriverGet(uint32_t *count, zes_driver_handle_t *drivers) {
    if (!initialised) return UNINITIALIZED;
    if (!count) return INVALID_ARGUMENT;
    if (*count == 0 || !drivers) { *count = n_devices ? 1 : 0; return OK; }
    *count = n_devices ? 1 : 0;
    if (*count) drivers[0] = &driver_token;
    return OK;
}

ze_result_t zesDeviceGet(zes_driver_handle_t driver, uint32_t *count, zes_device_handle_t *out) {
    if (!initialised) return UNINITIALIZED;
    if (driver != &driver_token) return INVALID_ARGUMENT;
    return list(count, out, devices, sizeof(device_t), n_devices);
}

ze_result_t zesDeviceGetProperties(zes_device_handle_t h, zes_device_properties_t *p) {
    CHECK(h);
    device_t *d = owner(h);
    p->core.vendorId = 0x8086;
    p->core.deviceId = d->device_id;
    snprintf(p->core.name, sizeof p->core.name, "%s", d->model);
    p->numSubdevices = 0;
    snprintf(p->serialNumber, 64, "%s", d->serial);
    snprintf(p->modelName, 64, "%s", d->model);
    snprintf(p->vendorName, 64, "%s", "Intel(R) Corporation");
    snprintf(p->driverVersion, 64, "%s", d->driver);
    return OK;
}

ze_result_t zesDevicePciGetProperties(zes_device_handle_t h, zes_pci_properties_t *p) {
    calls[C_PCI]++;
    CHECK(h);
    device_t *d = owner(h);
    p->address.domain = d->domain; p->address.bus = d->bus;
    p->address.device = d->dev; p->address.function = d->fn;
    p->maxSpeed.gen = -1; p->maxSpeed.width = -1; p->maxSpeed.maxBandwidth = -1;
    return OK;
}

#define ENUM(fn, arr, cnt)                                                        \
    ze_result_t fn(zes_device_handle_t h, uint32_t *count, void **out) {         \
        CHECK(h);                                                                 \
        device_t *d = owner(h);                                                   \
        return list(count, out, d->arr, sizeof d->arr[0], d->cnt);                \
    }
ENUM(zesDeviceEnumEngineGroups, engines, n_engines)
ENUM(zesDeviceEnumMemoryModules, memory, n_memory)
ENUM(zesDeviceEnumPowerDomains, power, n_power)
ENUM(zesDeviceEnumTemperatureSensors, temps, n_temps)
ENUM(zesDeviceEnumFrequencyDomains, freqs, n_freqs)
ENUM(zesDeviceEnumRasErrorSets, ras, n_ras)

ze_result_t zesEngineGetProperties(zes_engine_handle_t h, zes_engine_properties_t *p) {
    CHECK(h);
    p->type = ((engine_t *)h)->group;
    p->onSubdevice = 0;
    return OK;
}

ze_result_t zesEngineGetActivity(zes_engine_handle_t h, zes_engine_stats_t *s) {
    calls[C_ENGINE_ACTIVITY]++;
    while (hang) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    CHECK(h);
    engine_t *e = h;
    s->activeTime = e->active + e->n * e->active_step;
    s->timestamp = e->ts + e->n * e->ts_step;
    e->n++;
    return OK;
}

ze_result_t zesMemoryGetProperties(zes_mem_handle_t h, zes_mem_properties_t *p) {
    CHECK(h);
    memory_t *m = h;
    p->type = 17; /* ZES_MEM_TYPE_GDDR6 */
    p->location = m->location;
    p->physicalSize = m->physical;
    p->busWidth = -1; p->numChannels = -1;
    return OK;
}

ze_result_t zesMemoryGetState(zes_mem_handle_t h, zes_mem_state_t *s) {
    calls[C_MEMORY_STATE]++;
    CHECK(h);
    memory_t *m = h;
    s->health = 1; /* ZES_MEM_HEALTH_OK */
    s->size = m->size; s->free = m->free;
    return OK;
}

ze_result_t zesMemoryGetBandwidth(zes_mem_handle_t h, zes_mem_bandwidth_t *b) {
    calls[C_MEMORY_BANDWIDTH]++;
    CHECK(h);
    memory_t *m = h;
    b->readCounter = m->rd + m->n * m->rd_step;
    b->writeCounter = m->wr + m->n * m->wr_step;
    b->timestamp = m->ts + m->n * m->ts_step;
    b->maxBandwidth = 0;
    m->n++;
    return OK;
}

ze_result_t zesPowerGetProperties(zes_pwr_handle_t h, zes_power_properties_t *p) {
    CHECK(h);
    p->onSubdevice = (ze_bool_t)((power_t *)h)->on_sub;
    return OK;
}

ze_result_t zesPowerGetEnergyCounter(zes_pwr_handle_t h, zes_power_energy_counter_t *c) {
    calls[C_ENERGY]++;
    CHECK(h);
    power_t *p = h;
    c->energy = p->energy + p->n * p->energy_step;
    c->timestamp = p->ts + p->n * p->ts_step;
    p->n++;
    return OK;
}

ze_result_t zesTemperatureGetProperties(zes_temp_handle_t h, zes_temp_properties_t *p) {
    CHECK(h);
    p->type = ((temp_t *)h)->type;
    return OK;
}

ze_result_t zesTemperatureGetState(zes_temp_handle_t h, double *celsius) {
    calls[C_TEMP]++;
    CHECK(h);
    *celsius = ((temp_t *)h)->celsius;
    return OK;
}

ze_result_t zesFrequencyGetProperties(zes_freq_handle_t h, zes_freq_properties_t *p) {
    CHECK(h);
    freq_t *q = h;
    p->type = q->type; p->min = q->min; p->max = q->max;
    return OK;
}

ze_result_t zesFrequencyGetState(zes_freq_handle_t h, zes_freq_state_t *s) {
    calls[C_FREQ]++;
    CHECK(h);
    freq_t *q = h;
    s->currentVoltage = -1; s->tdp = -1; s->efficient = -1;
    s->request = q->request; s->actual = q->actual; s->throttleReasons = q->throttle;
    return OK;
}

ze_result_t zesRasGetProperties(zes_ras_handle_t h, zes_ras_properties_t *p) {
    CHECK(h);
    p->type = ((ras_t *)h)->type;
    return OK;
}

ze_result_t zesRasGetState(zes_ras_handle_t h, ze_bool_t clear, zes_ras_state_t *s) {
    calls[C_RAS]++;
    CHECK(h);
    if (clear) return 0x70010000u; /* the exporter never clears: INSUFFICIENT_PERMISSIONS */
    memcpy(s->category, ((ras_t *)h)->category, sizeof s->category);
    return OK;
}

ze_result_t zesDeviceProcessesGetState(zes_device_handle_t h, uint32_t *count,
                                       zes_process_state_t *out) {
    calls[C_PROCESSES]++;
    CHECK(h);
    device_t *d = owner(h);
    if (!count) return INVALID_ARGUMENT;
    if (*count == 0 || !out) { *count = d->n_procs; return OK; }
    if (*count > d->n_procs) *count = d->n_procs;
    for (uint32_t i = 0; i < *count; i++) {
        out[i].processId = d->procs[i].pid;
        out[i].memSize = d->procs[i].mem;
        out[i].sharedSize = d->procs[i].shared;
        out[i].engines = d->procs[i].engines;
    }
    return OK;
}

/* --- test controls ------------------------------------------------------------------ */

void zeStubSetInitResult(uint32_t code) { init_result = code; }
void zeStubSetLost(uint32_t device, int lost) { if (device < MAXN) devices[device].lost = lost; }
void zeStubSetHang(int on) { hang = on; }

uint32_t zeStubCalls(const char *fn) {
    for (int i = 0; i < C_COUNT; i++)
        if (!strcmp(call_names[i], fn)) return calls[i];
    return 0;
}

/* "struct field offset" lines and "struct - size" lines, from this compiler. */
const char *zeStubLayout(void) {
    static char buf[16384];
    size_t used = 0;
#define STRUCT(S) used += snprintf(buf + used, sizeof buf - used, #S " - %zu\n", sizeof(S));
#define FIELD(S, F) \
    used += snprintf(buf + used, sizeof buf - used, #S " " #F " %zu\n", offsetof(S, F));
    ZE_LAYOUT_TABLE(STRUCT, FIELD)
#undef STRUCT
#undef FIELD
    return buf;
}
