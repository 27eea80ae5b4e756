// The go command would otherwise try to build this file into package mocknvml.
//go:build ignore

/*
 * mocknvml.c: a stand-in libnvidia-ml.so.1 for end-to-end tests on machines
 * without a GPU. It answers the part of NVML the device plugin calls from a
 * profile (a text file named by MOCK_NVML_PROFILE, read at the first
 * nvmlInit) and takes faults at run time from a control FIFO named by
 * MOCK_NVML_CONTROL. README.md in this directory and e2e/profiles/README.md
 * describe both; the build command is in the Makefile.
 *
 * Types and constants come from go-nvml's nvml.h, compiled with
 * NVML_NO_UNVERSIONED_FUNC_DEFS so that every function below is defined
 * under the exact symbol name it exports (nvmlInit is v1, nvmlInit_v2 is v2).
 * Versioned functions whose v1 struct layout differs (PciInfo,
 * NvLinkRemotePciInfo, EventSetWait) export only the version go-nvml picks.
 *
 * Built with -DMOCK_R470 it is an R470-era driver: functions and fields
 * added after R470 (nvmlDeviceGetCurrentClocksEventReasons,
 * nvmlDeviceGetNumaNodeId, nvmlDeviceGetTemperatureV, the recovery-action
 * field and event, ...) are not exported or not known, as on such a node.
 *
 * Locking: one mutex (mu) guards all state a call can see; the profile is
 * replaced only while no caller holds NVML open. Handles point into a static
 * array, so they stay valid for the life of the process (the library is
 * linked with -z nodelete, so dlclose never unmaps it either, even with the
 * control thread or a waiter still leaving our code).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nvml.h"

#define MAX_GPUS 64 /* PCIe rules keep GPU sets in a 64-bit mask */
#define MAX_SWITCHES 64
#define MAX_RULES 128
#define MAX_TOKENS 64
#define QUEUE_LEN 256
#define STR_LEN 96
#define LINE_LEN 4096
#define MAX_MIG 7          /* MIG devices a GPU can hold: nvmlDeviceGetMaxMigDeviceCount */
#define MIG_SLICES 7       /* GPU instance slices of an A100 or H100 */
#define MAX_GI_ID 14       /* GPU instance ids the driver hands out (its caps go up to gi14) */
#define MAX_CI_ID 7        /* compute instance ids within a GPU instance */
#define NO_INSTANCE 0xFFFFFFFFu /* an event's instance id when it has none */

#ifdef MOCK_R470
#define SUPPORTED_EVENTS \
    (nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeSingleBitEccError)
#else
#define SUPPORTED_EVENTS                                                                                \
    (nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeSingleBitEccError | \
     nvmlEventTypeGpuRecoveryAction)
#endif
#define XID_GPU_LOST 79
#define NVSWITCH_PCI_ID 0x22A310DEu /* NVSwitch gen 3, as H100 systems carry */

/* Which optional profile fields a GPU has; an absent one reads NOT_SUPPORTED. */
enum {
    HAS_NAME = 1 << 0,
    HAS_MEMORY = 1 << 1,
    HAS_NUMA = 1 << 2,
    HAS_TEMP = 1 << 3,
    HAS_SLOWDOWN = 1 << 4,
    HAS_SHUTDOWN = 1 << 5,
    HAS_MAXTEMP = 1 << 6,
    HAS_ARCH = 1 << 7,
    HAS_CC = 1 << 8,
    HAS_BRAND = 1 << 9,
    HAS_UUID = 1 << 10,
    HAS_BUS = 1 << 11,
    HAS_MINOR = 1 << 12,
    HAS_MIG = 1 << 13,
};

/* Signals a GPU answers NOT_SUPPORTED to (profile key unsupported=). */
enum {
    UNSUP_TEMP = 1 << 0,     /* temperature, both calls */
    UNSUP_THROTTLE = 1 << 1, /* clocks event (throttle) reasons, both calls */
    UNSUP_RECOVERY = 1 << 2, /* the recovery-action field */
    UNSUP_REMAP = 1 << 3,    /* remapped rows */
};

struct pci {
    unsigned domain, bus, dev, fn;
};

/* The remote end of one NVLink: a switch (by position) or a GPU (by index). */
struct link_end {
    int is_gpu;
    unsigned id;
};

struct nvswitch {
    char name[32];
    struct pci pci;
};

/* Pairs of GPUs whose nearest common PCIe ancestor is at most level. */
struct pcie_rule {
    nvmlGpuTopologyLevel_t level;
    int same_numa;      /* every pair on one NUMA node */
    uint64_t members;   /* else every pair inside this set */
};

/*
 * The GPU instance profiles a MIG GPU offers, by NVML profile index
 * (NVML_GPU_INSTANCE_PROFILE_*, what nvmlDeviceGetGpuInstanceProfileInfo
 * takes), with the profile ID an A100 or H100 driver gives each (the ID
 * column of nvidia-smi mig -lgip, what nvmlGpuInstanceInfo_t.profileId
 * holds). IDs are not indices, as on a real GPU. Memory is in eighths.
 */
struct gi_profile {
    unsigned index, id, slices, instances, eighths;
};
static const struct gi_profile gi_profiles[] = {
    {NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 7, 1},      /* 1g.10gb */
    {NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 1, 1}, /* 1g.10gb+me */
    {NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 4, 2}, /* 1g.20gb */
    {NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 3, 2},      /* 2g.20gb */
    {NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 2, 4},       /* 3g.40gb */
    {NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 1, 4},       /* 4g.40gb */
    {NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 1, 8},       /* 7g.80gb */
};
#define N_GI_PROFILES (sizeof gi_profiles / sizeof gi_profiles[0])

static const struct gi_profile *gi_profile(unsigned index)
{
    for (size_t k = 0; k < N_GI_PROFILES; k++)
        if (gi_profiles[k].index == index)
            return &gi_profiles[k];
    return NULL;
}

/* One MIG device (a compute instance), from a mig line of the profile. */
struct mig_dev {
    unsigned gi, ci, giprofile, slices, cislices, sms;
    unsigned long long memory; /* bytes */
    char uuid[STR_LEN], profile[32];
};

/* A GPU instance: what nvmlDeviceGetGpuInstanceById hands out. */
struct nvmlGpuInstance_st {
    unsigned gpu; /* the parent's index */
    unsigned id, profile_id, slices;
    unsigned start, size; /* placement, in memory slices */
};

/*
 * A GPU. Its MIG devices and GPU instances live inside it, so their handles
 * (pointers to migs[k] and gis[k]) are distinct, stable, and map back to the
 * GPU by address; a MIG handle is an nvmlDevice_t that points at a mig_dev.
 */
struct nvmlDevice_st {
    /* From the profile. */
    unsigned has;
    unsigned index, minor;
    char uuid[STR_LEN], name[STR_LEN];
    struct pci pci;
    unsigned pci_id;
    unsigned long long memory; /* bytes */
    int numa;
    unsigned temp, slowdown, shutdown, maxtemp;
    unsigned long long throttle;
    unsigned arch, brand;
    int cc_major, cc_minor;
    unsigned nlinks;
    struct link_end links[NVML_NVLINK_MAX_LINKS];
    unsigned unsupported; /* UNSUP_* */
    unsigned mig;         /* MIG mode, with HAS_MIG */
    unsigned nmig, ngis;
    struct mig_dev migs[MAX_MIG];            /* by MIG device index: the order of the mig lines */
    struct nvmlGpuInstance_st gis[MAX_MIG];  /* in the order the mig lines name them */
    /* Injected at run time. */
    int lost;
    int has_temp;
    unsigned cur_temp;
    unsigned long long cur_throttle;
    unsigned recovery;                 /* nvmlDeviceGpuRecoveryAction_t */
    int remap_pending, remap_failure;  /* remapped rows */
    unsigned transient;                /* device calls left to answer UNKNOWN */
    unsigned compute_mode;             /* nvmlComputeMode_t, kept until the library unloads */
};

struct profile {
    char driver[STR_LEN], nvml[STR_LEN];
    int cuda, has_cuda;
    unsigned ngpus, nswitches, nrules;
    struct nvmlDevice_st gpus[MAX_GPUS];
    struct nvswitch switches[MAX_SWITCHES];
    struct pcie_rule rules[MAX_RULES];
};

struct event {
    unsigned gpu;
    unsigned long long type, data;
    unsigned gi, ci; /* the MIG instance it is attributed to, or NO_INSTANCE */
};

struct nvmlEventSet_st {
    struct nvmlEventSet_st *next;
    unsigned long long mask[MAX_GPUS];
    struct event queue[QUEUE_LEN];
    unsigned head, len;
    pthread_cond_t cond;
    int waiters;
    int freed; /* unlinked; the last waiter out releases it */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct profile prof;           /* guarded by mu */
static unsigned refcount;             /* nvmlInit calls not yet shut down */
static unsigned long generation;      /* bumped at every final nvmlShutdown */
static int failing;                   /* "fail" injected */
static struct nvmlEventSet_st *sets;  /* live event sets */
static FILE *log_file;                    /* MOCK_NVML_LOG, or NULL */

/* lifecycle serialises nvmlInit and nvmlShutdown around the control thread. */
static pthread_mutex_t lifecycle = PTHREAD_MUTEX_INITIALIZER;
static pthread_t control_thread;
static int control_running;
static int stop_pipe[2] = {-1, -1};
static int control_fd = -1;  /* the FIFO, or the regular file tailed */
static int inotify_fd = -1;  /* for a regular file only */
static char reply_path[4096];

/* ---------------------------------------------------------------- logging */

static void log_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* log_line appends one time-stamped line to MOCK_NVML_LOG; call with mu held. */
static void log_line(const char *fmt, ...)
{
    if (!log_file)
        return;
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    fprintf(log_file, "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ mocknvml[%d]: ", tm.tm_year + 1900, tm.tm_mon + 1,
            tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000, (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    vfprintf(log_file, fmt, ap);
    va_end(ap);
    fputc('\n', log_file);
    fflush(log_file);
}

/* ---------------------------------------------------------------- parsing */

struct parser {
    const char *path;
    int line;
    char err[512];
    struct profile *p;
    struct nvmlDevice_st defaults;
};

static int fail_at(struct parser *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail_at(struct parser *ps, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(ps->err, sizeof ps->err, "%s:%d: %s", ps->path, ps->line, msg);
    return -1;
}

/*
 * tokenize splits line in place on blanks. A double-quoted run keeps its
 * blanks and loses its quotes (name="NVIDIA H100" is one token); # outside
 * quotes starts a comment. It returns the token count, or -1 for an
 * unterminated quote or too many tokens.
 */
static int tokenize(char *line, char **tok, int max)
{
    int n = 0;
    char *r = line, *w = line;
    for (;;) {
        while (*r == ' ' || *r == '\t' || *r == '\r' || *r == '\n')
            r++;
        if (*r == '\0' || *r == '#')
            return n;
        if (n == max)
            return -1;
        tok[n++] = w;
        int quoted = 0;
        for (; *r; r++) {
            if (*r == '"') {
                quoted = !quoted;
                continue;
            }
            if (!quoted && (*r == ' ' || *r == '\t' || *r == '\r' || *r == '\n' || *r == '#'))
                break;
            *w++ = *r;
        }
        if (quoted)
            return -1;
        int end_of_line = (*r == '\0' || *r == '#');
        if (!end_of_line)
            r++;
        *w++ = '\0';
        if (end_of_line)
            return n;
    }
}

/* parse_uint parses a whole decimal (base 10) or hex (base 16, 0x optional) number. */
static int parse_uint(const char *s, int base, unsigned long long max, unsigned long long *out)
{
    if (*s == '\0' || *s == '-' || *s == '+' || isspace((unsigned char)*s))
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, base);
    if (errno || *end != '\0' || v > max)
        return -1;
    *out = v;
    return 0;
}

/* parse_bus accepts [domain:]bus:device.function in hex, as NVML and sysfs write it. */
static int parse_bus(const char *s, struct pci *out)
{
    char buf[64];
    if (strlen(s) >= sizeof buf)
        return -1;
    strcpy(buf, s);
    char *parts[4];
    int n = 0;
    char *p = buf;
    parts[n++] = p;
    for (; *p; p++) {
        if (*p == ':' || *p == '.') {
            if (n == 4)
                return -1;
            if (*p == '.' && n < 2)
                return -1;
            *p = '\0';
            parts[n++] = p + 1;
        }
    }
    unsigned long long v[4] = {0, 0, 0, 0};
    int off = 4 - n; /* no domain given: domain 0 */
    if (n < 3)
        return -1;
    /* The last separator must be the dot before the function. */
    if (strchr(s, '.') == NULL || strrchr(s, '.') < strrchr(s, ':'))
        return -1;
    static const unsigned long long max[4] = {0xffffffffULL, 0xff, 0x1f, 0x7};
    static const size_t width[4] = {8, 2, 2, 1};
    for (int i = 0; i < n; i++) {
        int f = i + off;
        if (strlen(parts[i]) > width[f])
            return -1;
        for (const char *c = parts[i]; *c; c++)
            if (!isxdigit((unsigned char)*c))
                return -1;
        if (parse_uint(parts[i], 16, max[f], &v[f]))
            return -1;
    }
    out->domain = (unsigned)v[0];
    out->bus = (unsigned)v[1];
    out->dev = (unsigned)v[2];
    out->fn = (unsigned)v[3];
    return 0;
}

static int same_pci(const struct pci *a, const struct pci *b)
{
    return a->domain == b->domain && a->bus == b->bus && a->dev == b->dev && a->fn == b->fn;
}

static const struct {
    const char *name;
    unsigned value;
} arches[] = {
    {"kepler", NVML_DEVICE_ARCH_KEPLER}, {"maxwell", NVML_DEVICE_ARCH_MAXWELL},
    {"pascal", NVML_DEVICE_ARCH_PASCAL}, {"volta", NVML_DEVICE_ARCH_VOLTA},
    {"turing", NVML_DEVICE_ARCH_TURING}, {"ampere", NVML_DEVICE_ARCH_AMPERE},
    {"ada", NVML_DEVICE_ARCH_ADA},       {"hopper", NVML_DEVICE_ARCH_HOPPER},
    {"blackwell", NVML_DEVICE_ARCH_BLACKWELL},
};

static const struct {
    const char *name;
    unsigned value;
} brands[] = {
    {"quadro", NVML_BRAND_QUADRO}, {"tesla", NVML_BRAND_TESLA},   {"nvs", NVML_BRAND_NVS},
    {"geforce", NVML_BRAND_GEFORCE}, {"titan", NVML_BRAND_TITAN}, {"quadro-rtx", NVML_BRAND_QUADRO_RTX},
    {"nvidia-rtx", NVML_BRAND_NVIDIA_RTX}, {"nvidia", NVML_BRAND_NVIDIA},
};

static const struct {
    const char *name;
    nvmlGpuTopologyLevel_t value;
} levels[] = {
    {"internal", NVML_TOPOLOGY_INTERNAL},     {"single", NVML_TOPOLOGY_SINGLE},
    {"multiple", NVML_TOPOLOGY_MULTIPLE},     {"hostbridge", NVML_TOPOLOGY_HOSTBRIDGE},
    {"node", NVML_TOPOLOGY_NODE},             {"system", NVML_TOPOLOGY_SYSTEM},
};

#define LOOKUP(table, key, out)                                           \
    ({                                                                    \
        int found_ = 0;                                                   \
        for (size_t i_ = 0; i_ < sizeof table / sizeof table[0]; i_++)    \
            if (strcmp(table[i_].name, key) == 0) {                       \
                *(out) = table[i_].value;                                 \
                found_ = 1;                                               \
                break;                                                    \
            }                                                             \
        found_;                                                           \
    })

static int copy_str(struct parser *ps, const char *key, const char *val, char *dst, size_t size)
{
    if (*val == '\0')
        return fail_at(ps, "%s is empty", key);
    if (strlen(val) >= size)
        return fail_at(ps, "%s %.40s... is longer than %zu bytes", key, val, size - 1);
    strcpy(dst, val);
    return 0;
}

/* parse_nvlinks reads "end*count,end,..." where end is a declared switch or gpuN. */
static int parse_nvlinks(struct parser *ps, const char *val, struct nvmlDevice_st *g)
{
    char buf[LINE_LEN];
    g->nlinks = 0;
    if (strcmp(val, "none") == 0)
        return 0;
    snprintf(buf, sizeof buf, "%s", val);
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        unsigned long long count = 1;
        char *star = strchr(item, '*');
        if (star) {
            *star = '\0';
            if (parse_uint(star + 1, 10, NVML_NVLINK_MAX_LINKS, &count) || count == 0)
                return fail_at(ps, "nvlink: %s*%s: the count must be 1 to %d", item, star + 1,
                               NVML_NVLINK_MAX_LINKS);
        }
        struct link_end end = {0, 0};
        int found = 0;
        for (unsigned i = 0; i < ps->p->nswitches; i++)
            if (strcmp(ps->p->switches[i].name, item) == 0) {
                end.id = i;
                found = 1;
            }
        unsigned long long gi;
        if (!found && strncmp(item, "gpu", 3) == 0 && parse_uint(item + 3, 10, MAX_GPUS - 1, &gi) == 0) {
            end.is_gpu = 1;
            end.id = (unsigned)gi; /* checked against the GPU count at the end */
            found = 1;
        }
        if (!found)
            return fail_at(ps, "nvlink: %s is neither an nvswitch declared above nor gpuN", item);
        if (g->nlinks + count > NVML_NVLINK_MAX_LINKS)
            return fail_at(ps, "nvlink: more than %d links", NVML_NVLINK_MAX_LINKS);
        for (unsigned long long k = 0; k < count; k++)
            g->links[g->nlinks++] = end;
    }
    if (g->nlinks == 0)
        return fail_at(ps, "nvlink: empty list (write nvlink=none for a GPU without NVLink)");
    return 0;
}

/* parse_unsupported reads "temp,throttle,recovery,remap" or "none". */
static int parse_unsupported(struct parser *ps, const char *val, unsigned *out)
{
    static const struct {
        const char *name;
        unsigned bit;
    } names[] = {{"temp", UNSUP_TEMP}, {"throttle", UNSUP_THROTTLE}, {"recovery", UNSUP_RECOVERY}, {"remap", UNSUP_REMAP}};
    *out = 0;
    if (!strcmp(val, "none"))
        return 0;
    char buf[LINE_LEN];
    snprintf(buf, sizeof buf, "%s", val);
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        size_t i = 0;
        while (i < sizeof names / sizeof names[0] && strcmp(names[i].name, item) != 0)
            i++;
        if (i == sizeof names / sizeof names[0])
            return fail_at(ps, "unsupported: %s is not one of temp throttle recovery remap", item);
        *out |= names[i].bit;
    }
    if (*out == 0)
        return fail_at(ps, "unsupported: empty list (write unsupported=none for none)");
    return 0;
}

/* parse_gpu_keys applies key=value tokens to g; identity keys only when allowed. */
static int parse_gpu_keys(struct parser *ps, char **tok, int n, struct nvmlDevice_st *g, int identity)
{
    for (int i = 0; i < n; i++) {
        char *eq = strchr(tok[i], '=');
        if (!eq)
            return fail_at(ps, "%s: expected key=value", tok[i]);
        *eq = '\0';
        const char *key = tok[i], *val = eq + 1;
        unsigned long long v;
        if (!identity && (!strcmp(key, "uuid") || !strcmp(key, "bus") || !strcmp(key, "minor")))
            return fail_at(ps, "%s belongs on each gpu line, not in defaults", key);
        if (!strcmp(key, "uuid")) {
            if (copy_str(ps, key, val, g->uuid, 80))
                return -1;
            if (strncmp(val, "GPU-", 4) != 0)
                return fail_at(ps, "uuid %s does not start with GPU-", val);
            g->has |= HAS_UUID;
        } else if (!strcmp(key, "name")) {
            if (copy_str(ps, key, val, g->name, sizeof g->name))
                return -1;
            g->has |= HAS_NAME;
        } else if (!strcmp(key, "bus")) {
            if (parse_bus(val, &g->pci))
                return fail_at(ps, "bus %s is not a PCI address like 0000:18:00.0", val);
            g->has |= HAS_BUS;
        } else if (!strcmp(key, "minor")) {
            if (parse_uint(val, 10, 255, &v))
                return fail_at(ps, "minor %s is not a number from 0 to 255", val);
            g->minor = (unsigned)v;
            g->has |= HAS_MINOR;
        } else if (!strcmp(key, "memory")) {
            if (parse_uint(val, 10, 1ULL << 40, &v) || v == 0)
                return fail_at(ps, "memory %s is not a size in MiB", val);
            g->memory = v << 20;
            g->has |= HAS_MEMORY;
        } else if (!strcmp(key, "numa")) {
            if (parse_uint(val, 10, 1023, &v))
                return fail_at(ps, "numa %s is not a NUMA node number", val);
            g->numa = (int)v;
            g->has |= HAS_NUMA;
        } else if (!strcmp(key, "temp") || !strcmp(key, "slowdown") || !strcmp(key, "shutdown") ||
                   !strcmp(key, "maxtemp")) {
            if (parse_uint(val, 10, 200, &v))
                return fail_at(ps, "%s %s is not a temperature from 0 to 200 C", key, val);
            if (!strcmp(key, "temp")) {
                g->temp = (unsigned)v;
                g->has |= HAS_TEMP;
            } else if (!strcmp(key, "slowdown")) {
                g->slowdown = (unsigned)v;
                g->has |= HAS_SLOWDOWN;
            } else if (!strcmp(key, "shutdown")) {
                g->shutdown = (unsigned)v;
                g->has |= HAS_SHUTDOWN;
            } else {
                g->maxtemp = (unsigned)v;
                g->has |= HAS_MAXTEMP;
            }
        } else if (!strcmp(key, "throttle")) {
            if (parse_uint(val, 16, ~0ULL, &v))
                return fail_at(ps, "throttle %s is not a hex mask", val);
            g->throttle = v;
        } else if (!strcmp(key, "arch")) {
            if (!LOOKUP(arches, val, &g->arch))
                return fail_at(ps, "arch %s is not one of kepler maxwell pascal volta turing ampere ada hopper blackwell", val);
            g->has |= HAS_ARCH;
        } else if (!strcmp(key, "brand")) {
            if (!LOOKUP(brands, val, &g->brand))
                return fail_at(ps, "brand %s is not one of quadro tesla nvs geforce titan quadro-rtx nvidia-rtx nvidia", val);
            g->has |= HAS_BRAND;
        } else if (!strcmp(key, "cc")) {
            char *dot = strchr(val, '.');
            unsigned long long mj, mn;
            char major[16];
            if (!dot || (size_t)(dot - val) >= sizeof major)
                return fail_at(ps, "cc %s is not major.minor like 9.0", val);
            memcpy(major, val, dot - val);
            major[dot - val] = '\0';
            if (parse_uint(major, 10, 99, &mj) || parse_uint(dot + 1, 10, 99, &mn))
                return fail_at(ps, "cc %s is not major.minor like 9.0", val);
            g->cc_major = (int)mj;
            g->cc_minor = (int)mn;
            g->has |= HAS_CC;
        } else if (!strcmp(key, "pciid")) {
            if (parse_uint(val, 16, 0xffffffffULL, &v))
                return fail_at(ps, "pciid %s is not a hex device+vendor id like 0x233010de", val);
            g->pci_id = (unsigned)v;
        } else if (!strcmp(key, "nvlink")) {
            if (parse_nvlinks(ps, val, g))
                return -1;
        } else if (!strcmp(key, "mig")) {
            if (strcmp(val, "on") != 0 && strcmp(val, "off") != 0)
                return fail_at(ps, "mig %s is not on or off", val);
            g->mig = !strcmp(val, "on");
            g->has |= HAS_MIG;
        } else if (!strcmp(key, "unsupported")) {
            if (parse_unsupported(ps, val, &g->unsupported))
                return -1;
        } else {
            return fail_at(ps, "unknown key %s", key);
        }
    }
    return 0;
}

/* parse_members reads GPU indexes and ranges: "0 1", "0-3", "0,2,4-5". */
static int parse_members(struct parser *ps, char **tok, int n, uint64_t *out)
{
    *out = 0;
    for (int i = 0; i < n; i++) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", tok[i]);
        char *save = NULL;
        for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
            unsigned long long lo, hi;
            char *dash = strchr(item, '-');
            if (dash)
                *dash = '\0';
            if (parse_uint(item, 10, MAX_GPUS - 1, &lo))
                return fail_at(ps, "pcie: %s is not a GPU index", tok[i]);
            hi = lo;
            if (dash && (parse_uint(dash + 1, 10, MAX_GPUS - 1, &hi) || hi < lo))
                return fail_at(ps, "pcie: %s is not a GPU range like 0-3", tok[i]);
            for (unsigned long long g = lo; g <= hi; g++)
                *out |= 1ULL << g;
        }
    }
    if (*out == 0)
        return fail_at(ps, "pcie: no GPUs given (list indexes like 0 1 or 0-3, or write same-numa)");
    return 0;
}

/* mig_keys are the keys of a mig line, every one required. */
static const char *const mig_keys[] = {"gi", "ci", "profile", "giprofile", "slices", "cislices", "memory", "sms", "uuid"};
#define N_MIG_KEYS (sizeof mig_keys / sizeof mig_keys[0])

/*
 * parse_mig reads "mig <gpu index> key=value..." into the next MIG device
 * slot of that GPU, and checks it against the GPU and its other MIG devices:
 * the lines of one GPU instance agree on what the instance is, its compute
 * instances fit in its slices, and its GPU instances fit in the GPU's.
 */
static int parse_mig(struct parser *ps, char **tok, int n)
{
    struct profile *p = ps->p;
    unsigned long long idx, v;
    if (n < 2 || parse_uint(tok[1], 10, MAX_GPUS - 1, &idx))
        return fail_at(ps, "usage: mig <gpu index> gi= ci= profile= giprofile= slices= cislices= memory= sms= uuid=");
    if (idx >= p->ngpus)
        return fail_at(ps, "mig %llu: no gpu %llu above this line", idx, idx);
    struct nvmlDevice_st *g = &p->gpus[idx];
    if (!(g->has & HAS_MIG) || !g->mig)
        return fail_at(ps, "mig %llu: gpu %llu does not have mig=on", idx, idx);
    struct mig_dev m;
    memset(&m, 0, sizeof m);
    unsigned seen = 0;
    for (int i = 2; i < n; i++) {
        char *eq = strchr(tok[i], '=');
        if (!eq)
            return fail_at(ps, "%s: expected key=value", tok[i]);
        *eq = '\0';
        const char *key = tok[i], *val = eq + 1;
        size_t k = 0;
        while (k < N_MIG_KEYS && strcmp(mig_keys[k], key) != 0)
            k++;
        switch (k) {
        case 0: /* gi */
            if (parse_uint(val, 10, MAX_GI_ID, &v))
                return fail_at(ps, "gi %s is not a GPU instance id from 0 to %d", val, MAX_GI_ID);
            m.gi = (unsigned)v;
            break;
        case 1: /* ci */
            if (parse_uint(val, 10, MAX_CI_ID, &v))
                return fail_at(ps, "ci %s is not a compute instance id from 0 to %d", val, MAX_CI_ID);
            m.ci = (unsigned)v;
            break;
        case 2: /* profile */
            if (copy_str(ps, key, val, m.profile, sizeof m.profile))
                return -1;
            break;
        case 3: /* giprofile */
            if (parse_uint(val, 10, NVML_GPU_INSTANCE_PROFILE_COUNT - 1, &v) || !gi_profile((unsigned)v))
                return fail_at(ps, "giprofile %s is not an NVML GPU instance profile index the mock offers (0-4, 7, 9)", val);
            m.giprofile = (unsigned)v;
            break;
        case 4: /* slices */
        case 5: /* cislices */
            if (parse_uint(val, 10, MIG_SLICES, &v) || v == 0)
                return fail_at(ps, "%s %s is not a slice count from 1 to %d", key, val, MIG_SLICES);
            *(k == 4 ? &m.slices : &m.cislices) = (unsigned)v;
            break;
        case 6: /* memory */
            if (parse_uint(val, 10, 1ULL << 40, &v) || v == 0)
                return fail_at(ps, "memory %s is not a size in MiB", val);
            m.memory = v << 20;
            break;
        case 7: /* sms */
            if (parse_uint(val, 10, 65535, &v) || v == 0)
                return fail_at(ps, "sms %s is not a multiprocessor count from 1 to 65535", val);
            m.sms = (unsigned)v;
            break;
        case 8: /* uuid */
            if (copy_str(ps, key, val, m.uuid, 80))
                return -1;
            if (strncmp(val, "MIG-", 4) != 0)
                return fail_at(ps, "uuid %s does not start with MIG-", val);
            break;
        default:
            return fail_at(ps, "mig: unknown key %s", key);
        }
        seen |= 1u << k;
    }
    if (seen != (1u << N_MIG_KEYS) - 1)
        return fail_at(ps, "mig %llu: gi, ci, profile, giprofile, slices, cislices, memory, sms and uuid are required", idx);
    if (m.slices != gi_profile(m.giprofile)->slices)
        return fail_at(ps, "mig %llu: giprofile %u has %u slices, not %u", idx, m.giprofile,
                       gi_profile(m.giprofile)->slices, m.slices);
    if (m.cislices > m.slices)
        return fail_at(ps, "mig %llu: cislices %u is more than slices %u", idx, m.cislices, m.slices);
    if ((g->has & HAS_MEMORY) && m.memory > g->memory)
        return fail_at(ps, "mig %llu: memory %llu MiB is more than the GPU's %llu MiB", idx, m.memory >> 20,
                       g->memory >> 20);
    for (unsigned i = 0; i < p->ngpus; i++)
        for (unsigned j = 0; j < p->gpus[i].nmig; j++)
            if (!strcmp(p->gpus[i].migs[j].uuid, m.uuid))
                return fail_at(ps, "mig %llu: uuid %s is also gpu %u's MIG device %u", idx, m.uuid, i, j);
    unsigned ci_slices = m.cislices;
    for (unsigned j = 0; j < g->nmig; j++) {
        const struct mig_dev *o = &g->migs[j];
        if (o->gi != m.gi)
            continue;
        if (o->ci == m.ci)
            return fail_at(ps, "mig %llu: gi %u ci %u is declared twice", idx, m.gi, m.ci);
        if (o->giprofile != m.giprofile || o->slices != m.slices || o->memory != m.memory)
            return fail_at(ps, "mig %llu: gi %u differs from its earlier line in giprofile, slices or memory", idx, m.gi);
        ci_slices += o->cislices;
    }
    if (ci_slices > m.slices)
        return fail_at(ps, "mig %llu: the compute instances of gi %u take more than its %u slices", idx, m.gi, m.slices);
    /* Slices bound the counts (a CI takes at least one), so the arrays cannot overflow. */
    if (g->nmig == MAX_MIG)
        return fail_at(ps, "mig %llu: more than %d MIG devices", idx, MAX_MIG);
    unsigned k = 0;
    while (k < g->ngis && g->gis[k].id != m.gi)
        k++;
    if (k == g->ngis) { /* the first line of this GPU instance */
        unsigned gi_slices = m.slices, placed = 0;
        for (unsigned j = 0; j < g->ngis; j++) {
            gi_slices += g->gis[j].slices;
            placed += g->gis[j].size;
        }
        if (gi_slices > MIG_SLICES)
            return fail_at(ps, "mig %llu: its GPU instances take more than %d slices", idx, MIG_SLICES);
        struct nvmlGpuInstance_st *gi = &g->gis[g->ngis++];
        gi->gpu = g->index;
        gi->id = m.gi;
        gi->profile_id = gi_profile(m.giprofile)->id;
        gi->slices = m.slices;
        /* Placed one after another, each over the eighths of memory it holds. */
        gi->start = placed;
        gi->size = (g->has & HAS_MEMORY) ? (unsigned)((m.memory * 8 + g->memory - 1) / g->memory) : m.slices;
    }
    g->migs[g->nmig++] = m;
    return 0;
}

static int parse_line(struct parser *ps, char *line)
{
    struct profile *p = ps->p;
    char *tok[MAX_TOKENS];
    int n = tokenize(line, tok, MAX_TOKENS);
    if (n < 0)
        return fail_at(ps, "unterminated quote or more than %d words", MAX_TOKENS);
    if (n == 0)
        return 0;
    const char *kw = tok[0];
    if (!strcmp(kw, "driver") || !strcmp(kw, "nvml")) {
        if (n != 2)
            return fail_at(ps, "usage: %s <version>", kw);
        return copy_str(ps, kw, tok[1], !strcmp(kw, "driver") ? p->driver : p->nvml, 80);
    }
    if (!strcmp(kw, "cuda")) {
        unsigned long long v;
        if (n != 2 || parse_uint(tok[1], 10, 1000000, &v))
            return fail_at(ps, "usage: cuda <version as NVML's integer, 12040 for 12.4>");
        p->cuda = (int)v;
        p->has_cuda = 1;
        return 0;
    }
    if (!strcmp(kw, "nvswitch")) {
        if (n != 3)
            return fail_at(ps, "usage: nvswitch <name> <PCI address>");
        if (p->nswitches == MAX_SWITCHES)
            return fail_at(ps, "more than %d nvswitches", MAX_SWITCHES);
        struct nvswitch *s = &p->switches[p->nswitches];
        if (strncmp(tok[1], "gpu", 3) == 0)
            return fail_at(ps, "nvswitch %s: names starting with gpu are kept for GPU links", tok[1]);
        for (unsigned i = 0; i < p->nswitches; i++)
            if (!strcmp(p->switches[i].name, tok[1]))
                return fail_at(ps, "nvswitch %s declared twice", tok[1]);
        if (copy_str(ps, "nvswitch name", tok[1], s->name, sizeof s->name))
            return -1;
        if (parse_bus(tok[2], &s->pci))
            return fail_at(ps, "nvswitch %s: %s is not a PCI address like 0000:05:00.0", tok[1], tok[2]);
        p->nswitches++;
        return 0;
    }
    if (!strcmp(kw, "defaults"))
        return parse_gpu_keys(ps, tok + 1, n - 1, &ps->defaults, 0);
    if (!strcmp(kw, "gpu")) {
        unsigned long long idx;
        if (p->ngpus == MAX_GPUS)
            return fail_at(ps, "more than %d GPUs", MAX_GPUS);
        if (n < 2 || parse_uint(tok[1], 10, MAX_GPUS - 1, &idx))
            return fail_at(ps, "usage: gpu <index> key=value...");
        if (idx != p->ngpus)
            return fail_at(ps, "gpu %llu: GPUs must be listed in index order, expected gpu %u", idx, p->ngpus);
        struct nvmlDevice_st *g = &p->gpus[p->ngpus];
        *g = ps->defaults;
        g->index = (unsigned)idx;
        if (parse_gpu_keys(ps, tok + 2, n - 2, g, 1))
            return -1;
        if ((g->has & (HAS_UUID | HAS_BUS | HAS_MINOR)) != (HAS_UUID | HAS_BUS | HAS_MINOR))
            return fail_at(ps, "gpu %llu: uuid, bus and minor are required", idx);
        for (unsigned i = 0; i < p->ngpus; i++) {
            if (!strcmp(p->gpus[i].uuid, g->uuid))
                return fail_at(ps, "gpu %llu: uuid %s is also gpu %u's", idx, g->uuid, i);
            if (same_pci(&p->gpus[i].pci, &g->pci))
                return fail_at(ps, "gpu %llu: bus is also gpu %u's", idx, i);
            if (p->gpus[i].minor == g->minor)
                return fail_at(ps, "gpu %llu: minor %u is also gpu %u's", idx, g->minor, i);
        }
        for (unsigned i = 0; i < p->nswitches; i++)
            if (same_pci(&p->switches[i].pci, &g->pci))
                return fail_at(ps, "gpu %llu: bus is also nvswitch %s's", idx, p->switches[i].name);
        p->ngpus++;
        return 0;
    }
    if (!strcmp(kw, "mig"))
        return parse_mig(ps, tok, n);
    if (!strcmp(kw, "pcie")) {
        if (n < 3)
            return fail_at(ps, "usage: pcie <level> same-numa | pcie <level> <GPU indexes>");
        if (p->nrules == MAX_RULES)
            return fail_at(ps, "more than %d pcie rules", MAX_RULES);
        struct pcie_rule *r = &p->rules[p->nrules];
        if (!LOOKUP(levels, tok[1], &r->level))
            return fail_at(ps, "pcie: level %s is not one of internal single multiple hostbridge node system", tok[1]);
        if (n == 3 && !strcmp(tok[2], "same-numa"))
            r->same_numa = 1;
        else if (parse_members(ps, tok + 2, n - 2, &r->members))
            return -1;
        p->nrules++;
        return 0;
    }
    return fail_at(ps, "unknown keyword %s (want driver, nvml, cuda, nvswitch, defaults, gpu, mig or pcie)", kw);
}

/* load_profile parses path into p; on error it fills err with path:line: message. */
static int load_profile(const char *path, struct profile *p, char *err, size_t errlen)
{
    struct parser *ps = calloc(1, sizeof *ps);
    if (!ps) {
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    ps->path = path;
    ps->p = p;
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "opening profile %s: %s", path, strerror(errno));
        free(ps);
        return -1;
    }
    char line[LINE_LEN];
    int rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        ps->line++;
        if (!strchr(line, '\n') && !feof(f))
            rc = fail_at(ps, "line longer than %d bytes", LINE_LEN - 2);
        else
            rc = parse_line(ps, line);
    }
    if (rc == 0 && ferror(f))
        rc = fail_at(ps, "reading: %s", strerror(errno));
    fclose(f);
    /* References that may point forward: GPU links and rule members. */
    for (unsigned i = 0; rc == 0 && i < p->ngpus; i++)
        for (unsigned l = 0; l < p->gpus[i].nlinks; l++)
            if (p->gpus[i].links[l].is_gpu && p->gpus[i].links[l].id >= p->ngpus) {
                snprintf(ps->err, sizeof ps->err, "%s: gpu %u: nvlink to gpu%u, but there are %u GPUs", path, i,
                         p->gpus[i].links[l].id, p->ngpus);
                rc = -1;
                break;
            }
    for (unsigned r = 0; rc == 0 && r < p->nrules; r++)
        if (!p->rules[r].same_numa && p->ngpus < 64 && (p->rules[r].members >> p->ngpus) != 0) {
            snprintf(ps->err, sizeof ps->err, "%s: pcie rule %u names a GPU index beyond the %u GPUs", path, r + 1,
                     p->ngpus);
            rc = -1;
        }
    if (rc)
        snprintf(err, errlen, "%s", ps->err);
    free(ps);
    return rc;
}

/* ------------------------------------------------------------ error strings */

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt request issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires reset";
    case NVML_ERROR_OPERATING_SYSTEM: return "GPU access blocked by the operating system";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "Driver/library version mismatch";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not Ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Unknown Error";
    }
}

/* ------------------------------------------------------------------ events */

static void set_destroy(struct nvmlEventSet_st *s)
{
    pthread_cond_destroy(&s->cond);
    free(s);
}

/* set_unlink removes s from the live list; call with mu held. */
static void set_unlink(struct nvmlEventSet_st *s)
{
    for (struct nvmlEventSet_st **pp = &sets; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    s->freed = 1;
    pthread_cond_broadcast(&s->cond);
    if (s->waiters == 0)
        set_destroy(s);
}

static struct nvmlEventSet_st *set_find(struct nvmlEventSet_st *h)
{
    for (struct nvmlEventSet_st *s = sets; s; s = s->next)
        if (s == h)
            return s;
    return NULL;
}

/*
 * deliver queues an event on every set registered for it; call with mu held.
 * gi and ci name the MIG instance it belongs to (NO_INSTANCE for none): like
 * NVML's, the event comes on the parent GPU, with the instance in its data.
 */
static void deliver(unsigned gpu, unsigned long long type, unsigned long long data, unsigned gi, unsigned ci)
{
    for (struct nvmlEventSet_st *s = sets; s; s = s->next) {
        if (!(s->mask[gpu] & type))
            continue;
        if (s->len == QUEUE_LEN) {
            log_line("event queue of set %p full; dropping its oldest event", (void *)s);
            s->head = (s->head + 1) % QUEUE_LEN;
            s->len--;
        }
        s->queue[(s->head + s->len) % QUEUE_LEN] = (struct event){gpu, type, data, gi, ci};
        s->len++;
        pthread_cond_signal(&s->cond);
    }
}

/* ----------------------------------------------------------- fault control */

static void reply(const char *id, const char *msg)
{
    if (!id || reply_path[0] == '\0')
        return;
    /* Opened per reply so a Control that appears after nvmlInit still hears;
     * nonblocking so a reader that went away never stalls the library. */
    int fd = open(reply_path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return;
    char buf[LINE_LEN];
    int n = snprintf(buf, sizeof buf, "%s %s\n", id, msg);
    if (n > 0 && write(fd, buf, (size_t)n) != n) {
        pthread_mutex_lock(&mu);
        log_line("reply %s not written: %s", id, strerror(errno));
        pthread_mutex_unlock(&mu);
    }
    close(fd);
}

/* reset_faults puts a GPU back to its profile's state. */
static void reset_faults(struct nvmlDevice_st *g)
{
    g->lost = 0;
    g->has_temp = !!(g->has & HAS_TEMP);
    g->cur_temp = g->temp;
    g->cur_throttle = g->throttle;
    g->recovery = 0;
    g->remap_pending = g->remap_failure = 0;
    g->transient = 0;
}

/* mig_instance says whether GPU instance gi (and compute instance ci, unless NO_INSTANCE) exists on g. */
static int mig_instance(const struct nvmlDevice_st *g, unsigned gi, unsigned ci)
{
    for (unsigned k = 0; k < g->nmig; k++)
        if (g->migs[k].gi == gi && (ci == NO_INSTANCE || g->migs[k].ci == ci))
            return 1;
    return 0;
}

/* apply runs one control command; it fills err and returns -1 when the command is wrong. */
static int apply(char **tok, int n, char *err, size_t errlen)
{
    const char *cmd = tok[0];
    if (!strcmp(cmd, "fail") || !strcmp(cmd, "unfail")) {
        if (n != 1) {
            snprintf(err, errlen, "usage: %s", cmd);
            return -1;
        }
        failing = !strcmp(cmd, "fail");
        return 0;
    }
    static const struct {
        const char *name;
        int min, max; /* words after the index */
        const char *usage;
    } cmds[] = {
        {"xid", 1, 3, "xid <index> <code> [<gi> [<ci>]]"},
        {"ecc", 0, 1, "ecc <index> [double|single]"},
        {"temp", 1, 1, "temp <index> <celsius>"},
        {"throttle", 1, 1, "throttle <index> <hex reasons>"},
        {"lost", 0, 0, "lost <index>"},
        {"recover", 0, 0, "recover <index>"},
        {"recovery", 1, 1, "recovery <index> none|reset|reboot|drain|drain-and-reset"},
        {"remap", 1, 1, "remap <index> none|pending|failure"},
        {"transient", 1, 1, "transient <index> <calls>"},
    };
    const char *usage = NULL;
    int min = 0, max = 0;
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(cmds[i].name, cmd)) {
            usage = cmds[i].usage;
            min = cmds[i].min;
            max = cmds[i].max;
        }
    if (!usage) {
        snprintf(err, errlen, "unknown command %s (want xid, ecc, temp, throttle, lost, recover, recovery, remap, transient, fail or unfail)", cmd);
        return -1;
    }
    unsigned long long idx, v = 0;
    if (n < 2 + min || n > 2 + max || parse_uint(tok[1], 10, MAX_GPUS, &idx)) {
        snprintf(err, errlen, "usage: %s", usage);
        return -1;
    }
    if (idx >= prof.ngpus) {
        snprintf(err, errlen, "%s: no GPU %llu (the profile has %u)", cmd, idx, prof.ngpus);
        return -1;
    }
    struct nvmlDevice_st *g = &prof.gpus[idx];
    if (!strcmp(cmd, "xid")) {
        if (parse_uint(tok[2], 10, ~0ULL, &v)) {
            snprintf(err, errlen, "xid: %s is not a decimal XID", tok[2]);
            return -1;
        }
        unsigned long long gi = NO_INSTANCE, ci = NO_INSTANCE;
        if (n >= 4 && (parse_uint(tok[3], 10, MAX_GI_ID, &gi) || (n == 5 && parse_uint(tok[4], 10, MAX_CI_ID, &ci)))) {
            snprintf(err, errlen, "usage: %s", usage);
            return -1;
        }
        if (n >= 4 && !mig_instance(g, (unsigned)gi, (unsigned)ci)) {
            if (n == 4)
                snprintf(err, errlen, "xid: gpu %llu has no GPU instance %llu", idx, gi);
            else
                snprintf(err, errlen, "xid: gpu %llu has no compute instance %llu in GPU instance %llu", idx, ci, gi);
            return -1;
        }
        deliver(g->index, nvmlEventTypeXidCriticalError, v, (unsigned)gi, (unsigned)ci);
    } else if (!strcmp(cmd, "ecc")) {
        unsigned long long type = nvmlEventTypeDoubleBitEccError;
        if (n == 3 && !strcmp(tok[2], "single"))
            type = nvmlEventTypeSingleBitEccError;
        else if (n == 3 && strcmp(tok[2], "double") != 0) {
            snprintf(err, errlen, "usage: %s", usage);
            return -1;
        }
        deliver(g->index, type, 0, NO_INSTANCE, NO_INSTANCE);
    } else if (!strcmp(cmd, "temp")) {
        if (parse_uint(tok[2], 10, 200, &v)) {
            snprintf(err, errlen, "temp: %s is not a temperature from 0 to 200 C", tok[2]);
            return -1;
        }
        g->cur_temp = (unsigned)v;
        g->has_temp = 1;
    } else if (!strcmp(cmd, "throttle")) {
        if (parse_uint(tok[2], 16, ~0ULL, &v)) {
            snprintf(err, errlen, "throttle: %s is not a hex mask", tok[2]);
            return -1;
        }
        g->cur_throttle = v;
    } else if (!strcmp(cmd, "lost")) {
        g->lost = 1;
        deliver(g->index, nvmlEventTypeXidCriticalError, XID_GPU_LOST, NO_INSTANCE, NO_INSTANCE);
    } else if (!strcmp(cmd, "recovery")) {
        static const char *const actions[] = {"none", "reset", "reboot", "drain", "drain-and-reset"};
        unsigned a = 0;
        while (a < sizeof actions / sizeof actions[0] && strcmp(actions[a], tok[2]) != 0)
            a++;
        if (a == sizeof actions / sizeof actions[0]) {
            snprintf(err, errlen, "usage: %s", usage);
            return -1;
        }
        g->recovery = a; /* the order of nvmlDeviceGpuRecoveryAction_t */
        /* eventData is 0 for every event but XIDs, as nvml.h says. */
        if (SUPPORTED_EVENTS & nvmlEventTypeGpuRecoveryAction)
            deliver(g->index, nvmlEventTypeGpuRecoveryAction, 0, NO_INSTANCE, NO_INSTANCE);
    } else if (!strcmp(cmd, "remap")) {
        if (strcmp(tok[2], "none") != 0 && strcmp(tok[2], "pending") != 0 && strcmp(tok[2], "failure") != 0) {
            snprintf(err, errlen, "usage: %s", usage);
            return -1;
        }
        g->remap_pending = !strcmp(tok[2], "pending");
        g->remap_failure = !strcmp(tok[2], "failure");
    } else if (!strcmp(cmd, "transient")) {
        if (parse_uint(tok[2], 10, 1000000, &v) || v == 0) {
            snprintf(err, errlen, "transient: %s is not a count of calls from 1", tok[2]);
            return -1;
        }
        g->transient = (unsigned)v;
    } else { /* recover */
        reset_faults(g);
    }
    return 0;
}

/* command handles one control line: "[@id ]command args...". */
static void command(char *line)
{
    char *tok[16];
    char err[512] = "";
    char id_buf[32];
    const char *id = NULL;
    while (*line == ' ' || *line == '\t')
        line++;
    if (*line == '@') {
        size_t len = strcspn(line, " \t\r");
        snprintf(id_buf, sizeof id_buf, "%.*s", (int)(len < sizeof id_buf ? len : sizeof id_buf - 1), line);
        id = id_buf;
        line += len;
    }
    int n = tokenize(line, tok, 16);
    if (n <= 0) {
        if (n < 0) {
            pthread_mutex_lock(&mu);
            log_line("rejected: unterminated quote or too many words");
            pthread_mutex_unlock(&mu);
        }
        reply(id, n < 0 ? "error: unterminated quote or too many words" : "error: empty command");
        return;
    }
    /* Rebuild the command for the log (tokenize consumed the blanks). */
    char text[512] = "";
    for (int i = 0; i < n; i++) {
        size_t used = strlen(text);
        snprintf(text + used, sizeof text - used, "%s%s", i ? " " : "", tok[i]);
    }
    pthread_mutex_lock(&mu);
    int rc = apply(tok, n, err, sizeof err);
    if (rc == 0)
        log_line("injected: %s", text);
    else
        log_line("rejected: %s: %s", text, err);
    pthread_mutex_unlock(&mu);
    if (rc == 0) {
        reply(id, "ok");
    } else {
        char msg[600];
        snprintf(msg, sizeof msg, "error: %s", err);
        reply(id, msg);
    }
}

/* feed splits what was read into lines; a line longer than the buffer is dropped. */
static void feed(char *buf, size_t *used, size_t cap, const char *data, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char c = data[i];
        if (c == '\n') {
            if (*used <= cap) {
                buf[*used] = '\0';
                command(buf);
            } else {
                pthread_mutex_lock(&mu);
                log_line("control: line longer than %zu bytes dropped", cap);
                pthread_mutex_unlock(&mu);
            }
            *used = 0;
        } else {
            if (*used < cap)
                buf[*used] = c;
            (*used)++;
        }
    }
}

static void *control_main(void *arg)
{
    (void)arg;
    static char line[LINE_LEN + 1];
    size_t used = 0;
    char chunk[LINE_LEN];
    struct pollfd fds[2] = {
        {.fd = stop_pipe[0], .events = POLLIN},
        {.fd = inotify_fd >= 0 ? inotify_fd : control_fd, .events = POLLIN},
    };
    int tailing = inotify_fd >= 0;
    for (;;) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (fds[0].revents)
            break;
        if (tailing) {
            char ev[4096];
            while (read(inotify_fd, ev, sizeof ev) > 0) {
            }
            /* A file truncated under us starts over. */
            struct stat st;
            off_t pos = lseek(control_fd, 0, SEEK_CUR);
            if (fstat(control_fd, &st) == 0 && pos > st.st_size)
                lseek(control_fd, 0, SEEK_SET);
        }
        ssize_t n;
        while ((n = read(control_fd, chunk, sizeof chunk)) > 0)
            feed(line, &used, LINE_LEN, chunk, (size_t)n);
    }
    return NULL;
}

/* control_start opens MOCK_NVML_CONTROL (making a FIFO when missing) and starts its reader. */
static int control_start(const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno != ENOENT || (mkfifo(path, 0600) != 0 && errno != EEXIST)) {
            snprintf(err, errlen, "creating control FIFO %s: %s", path, strerror(errno));
            return -1;
        }
        if (stat(path, &st) != 0) {
            snprintf(err, errlen, "control %s: %s", path, strerror(errno));
            return -1;
        }
    }
    if (S_ISFIFO(st.st_mode)) {
        /* Read-write, so opening never waits for a writer and EOF never comes. */
        control_fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    } else if (S_ISREG(st.st_mode)) {
        /* A regular file is tailed from its end, like tail -f. */
        control_fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        if (control_fd >= 0) {
            lseek(control_fd, 0, SEEK_END);
            inotify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
            if (inotify_fd < 0 || inotify_add_watch(inotify_fd, path, IN_MODIFY) < 0) {
                snprintf(err, errlen, "watching control file %s: %s", path, strerror(errno));
                return -1;
            }
        }
    } else {
        snprintf(err, errlen, "control %s is neither a FIFO nor a regular file", path);
        return -1;
    }
    if (control_fd < 0) {
        snprintf(err, errlen, "opening control %s: %s", path, strerror(errno));
        return -1;
    }
    snprintf(reply_path, sizeof reply_path, "%s.reply", path);
    if (pipe2(stop_pipe, O_CLOEXEC) != 0) {
        snprintf(err, errlen, "control pipe: %s", strerror(errno));
        return -1;
    }
    /* Signals belong to the host program's threads, not ours. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&control_thread, NULL, control_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        snprintf(err, errlen, "starting control thread: %s", strerror(rc));
        return -1;
    }
    control_running = 1;
    return 0;
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static void control_stop(void)
{
    if (control_running) {
        char c = 'x';
        if (write(stop_pipe[1], &c, 1) != 1)
            perror("mocknvml: stopping control thread");
        pthread_join(control_thread, NULL);
        control_running = 0;
    }
    close_fd(&stop_pipe[0]);
    close_fd(&stop_pipe[1]);
    close_fd(&control_fd);
    close_fd(&inotify_fd);
    reply_path[0] = '\0';
}

/* ---------------------------------------------------------- init/shutdown */

static nvmlReturn_t init(void)
{
    pthread_mutex_lock(&lifecycle);
    pthread_mutex_lock(&mu);
    if (refcount > 0) {
        refcount++;
        pthread_mutex_unlock(&mu);
        pthread_mutex_unlock(&lifecycle);
        return NVML_SUCCESS;
    }
    pthread_mutex_unlock(&mu);

    char err[600];
    const char *path = getenv("MOCK_NVML_PROFILE");
    if (!path || !*path) {
        fprintf(stderr, "mocknvml: MOCK_NVML_PROFILE is not set; answering as a node whose driver is not loaded\n");
        pthread_mutex_unlock(&lifecycle);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    struct profile *p = calloc(1, sizeof *p);
    if (!p) {
        pthread_mutex_unlock(&lifecycle);
        return NVML_ERROR_MEMORY;
    }
    if (load_profile(path, p, err, sizeof err) != 0) {
        fprintf(stderr, "mocknvml: %s\n", err);
        free(p);
        pthread_mutex_unlock(&lifecycle);
        return NVML_ERROR_UNKNOWN;
    }
    for (unsigned i = 0; i < p->ngpus; i++)
        reset_faults(&p->gpus[i]);
    const char *logpath = getenv("MOCK_NVML_LOG");

    pthread_mutex_lock(&mu);
    prof = *p;
    failing = 0;
    if (logpath && *logpath && !log_file) {
        log_file = fopen(logpath, "ae");
        if (!log_file)
            fprintf(stderr, "mocknvml: opening MOCK_NVML_LOG %s: %s\n", logpath, strerror(errno));
    }
    log_line("nvmlInit: profile %s, %u GPUs", path, prof.ngpus);
    refcount = 1;
    pthread_mutex_unlock(&mu);
    free(p);

    const char *ctl = getenv("MOCK_NVML_CONTROL");
    if (ctl && *ctl && control_start(ctl, err, sizeof err) != 0) {
        fprintf(stderr, "mocknvml: %s\n", err);
        control_stop();
        pthread_mutex_lock(&mu);
        refcount = 0;
        pthread_mutex_unlock(&mu);
        pthread_mutex_unlock(&lifecycle);
        return NVML_ERROR_UNKNOWN;
    }
    pthread_mutex_unlock(&lifecycle);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit(void) { return init(); }
nvmlReturn_t nvmlInit_v2(void) { return init(); }

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags; /* NO_GPUS and NO_ATTACH change nothing here */
    return init();
}

nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&lifecycle);
    pthread_mutex_lock(&mu);
    if (refcount == 0) {
        pthread_mutex_unlock(&mu);
        pthread_mutex_unlock(&lifecycle);
        return NVML_ERROR_UNINITIALIZED;
    }
    if (--refcount > 0) {
        pthread_mutex_unlock(&mu);
        pthread_mutex_unlock(&lifecycle);
        return NVML_SUCCESS;
    }
    generation++;
    while (sets)
        set_unlink(sets); /* wakes waiters, who see the new generation */
    log_line("nvmlShutdown");
    pthread_mutex_unlock(&mu);
    control_stop();
    pthread_mutex_lock(&mu);
    if (log_file && refcount == 0) {
        fclose(log_file);
        log_file = NULL;
    }
    pthread_mutex_unlock(&mu);
    pthread_mutex_unlock(&lifecycle);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ system */

static nvmlReturn_t copy_out(char *dst, unsigned int len, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    size_t need = strlen(src) + 1;
    if (len < need)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, need);
    return NVML_SUCCESS;
}

static nvmlReturn_t system_string(char *dst, unsigned int len, const char *which)
{
    pthread_mutex_lock(&mu);
    nvmlReturn_t ret;
    if (refcount == 0)
        ret = NVML_ERROR_UNINITIALIZED;
    else if (which[0] == '\0')
        ret = NVML_ERROR_NOT_SUPPORTED;
    else
        ret = copy_out(dst, len, which);
    pthread_mutex_unlock(&mu);
    return ret;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    return system_string(version, length, prof.driver);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    return system_string(version, length, prof.nvml);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mu);
    nvmlReturn_t ret = NVML_SUCCESS;
    if (refcount == 0)
        ret = NVML_ERROR_UNINITIALIZED;
    else if (!prof.has_cuda)
        ret = NVML_ERROR_NOT_SUPPORTED;
    else
        *cudaDriverVersion = prof.cuda;
    pthread_mutex_unlock(&mu);
    return ret;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* ---------------------------------------------------------------- devices */

/*
 * member_of finds the GPU whose struct holds p at offset first + k * size
 * for some k < count(GPU), and sets *k; NULL when p is no such pointer. It
 * is how a handle is told apart from anything else: GPU handles are
 * &prof.gpus[i] (first 0, size the whole struct), MIG device and GPU
 * instance handles point into a GPU's migs and gis arrays.
 */
static struct nvmlDevice_st *member_of(const void *p, size_t first, size_t size,
                                       unsigned (*count)(const struct nvmlDevice_st *), unsigned *k)
{
    uintptr_t base = (uintptr_t)prof.gpus, a = (uintptr_t)p;
    if (a < base || a - base >= prof.ngpus * sizeof prof.gpus[0])
        return NULL;
    struct nvmlDevice_st *g = &prof.gpus[(a - base) / sizeof prof.gpus[0]];
    size_t off = (a - base) % sizeof prof.gpus[0];
    if (off < first || (off - first) % size != 0 || (off - first) / size >= count(g))
        return NULL;
    *k = (unsigned)((off - first) / size);
    return g;
}

static unsigned one(const struct nvmlDevice_st *g) { (void)g; return 1; }
static unsigned mig_count(const struct nvmlDevice_st *g) { return g->nmig; }
static unsigned gi_count(const struct nvmlDevice_st *g) { return g->ngis; }

/* mig_handle is the nvmlDevice_t of a MIG device: it points at the mig_dev, never dereferenced as a GPU. */
static struct nvmlDevice_st *mig_handle(struct mig_dev *m) { return (struct nvmlDevice_st *)(void *)m; }

/* gpu_state answers for the GPU a call reaches, MIG handles included: fail, lost, transient. */
static nvmlReturn_t gpu_state(struct nvmlDevice_st *g)
{
    if (failing)
        return NVML_ERROR_UNKNOWN;
    if (g->lost)
        return NVML_ERROR_GPU_IS_LOST;
    if (g->transient > 0) {
        g->transient--;
        return NVML_ERROR_UNKNOWN;
    }
    return NVML_SUCCESS;
}

/*
 * handle_check validates a GPU or MIG device handle for a call on it and
 * sets *gpu to the GPU (the parent, for a MIG handle) and *mig to the MIG
 * device or NULL; call with mu held.
 */
static nvmlReturn_t handle_check(struct nvmlDevice_st *h, struct nvmlDevice_st **gpu, struct mig_dev **mig)
{
    if (refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    unsigned k;
    struct nvmlDevice_st *g = member_of(h, 0, sizeof *h, one, &k);
    *mig = NULL;
    if (!g) {
        g = member_of(h, offsetof(struct nvmlDevice_st, migs), sizeof g->migs[0], mig_count, &k);
        if (!g)
            return NVML_ERROR_INVALID_ARGUMENT;
        *mig = &g->migs[k];
    }
    *gpu = g;
    return gpu_state(g);
}

/* device_check validates a GPU handle for a call that takes no MIG handle; call with mu held. */
static nvmlReturn_t device_check(struct nvmlDevice_st *h)
{
    struct nvmlDevice_st *g;
    struct mig_dev *m;
    nvmlReturn_t ret = handle_check(h, &g, &m);
    if (ret == NVML_SUCCESS && m)
        ret = NVML_ERROR_NOT_SUPPORTED; /* as NVML answers most calls on a MIG device */
    return ret;
}

/* device_begin locks mu and checks the handle; on success the caller must device_end. */
static nvmlReturn_t device_begin(nvmlDevice_t device)
{
    pthread_mutex_lock(&mu);
    nvmlReturn_t ret = device_check(device.handle);
    if (ret != NVML_SUCCESS)
        pthread_mutex_unlock(&mu);
    return ret;
}

static nvmlReturn_t device_end(nvmlReturn_t ret)
{
    pthread_mutex_unlock(&mu);
    return ret;
}

/* A device query: check the handle and out-pointer, then run body with g bound. */
#define DEVICE_QUERY(device, out, ...)                       \
    do {                                                      \
        nvmlReturn_t ret_ = device_begin(device);             \
        if (ret_ != NVML_SUCCESS)                             \
            return ret_;                                      \
        struct nvmlDevice_st *g = (device).handle;            \
        (void)g;                                              \
        if (!(out))                                           \
            return device_end(NVML_ERROR_INVALID_ARGUMENT);   \
        __VA_ARGS__;                                          \
        return device_end(ret_);                              \
    } while (0)

/*
 * A query that also takes MIG device handles: g is the GPU (the parent of a
 * MIG device), m the MIG device or NULL.
 */
#define MIG_QUERY(device, out, ...)                                  \
    do {                                                              \
        struct nvmlDevice_st *g;                                      \
        struct mig_dev *m;                                            \
        pthread_mutex_lock(&mu);                                      \
        nvmlReturn_t ret_ = handle_check((device).handle, &g, &m);    \
        if (ret_ != NVML_SUCCESS)                                     \
            return device_end(ret_);                                  \
        if (!(out))                                                   \
            return device_end(NVML_ERROR_INVALID_ARGUMENT);           \
        __VA_ARGS__;                                                  \
        return device_end(ret_);                                      \
    } while (0)

static nvmlReturn_t count(unsigned int *deviceCount)
{
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mu);
    nvmlReturn_t ret = NVML_SUCCESS;
    if (refcount == 0)
        ret = NVML_ERROR_UNINITIALIZED;
    else
        *deviceCount = prof.ngpus;
    pthread_mutex_unlock(&mu);
    return ret;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { return count(deviceCount); }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) { return count(deviceCount); }

/* handle_by returns the handle of the GPU match picks; lookups obey fail and lost. */
static nvmlReturn_t handle_by(int (*match)(const struct nvmlDevice_st *, const void *), const void *key,
                              nvmlReturn_t none, nvmlDevice_t *device)
{
    if (!device)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mu);
    nvmlReturn_t ret = none;
    if (refcount == 0) {
        ret = NVML_ERROR_UNINITIALIZED;
    } else {
        for (unsigned i = 0; i < prof.ngpus; i++)
            if (match(&prof.gpus[i], key)) {
                ret = device_check(&prof.gpus[i]);
                if (ret == NVML_SUCCESS)
                    device->handle = &prof.gpus[i];
                break;
            }
    }
    pthread_mutex_unlock(&mu);
    return ret;
}

static int match_index(const struct nvmlDevice_st *g, const void *key) { return g->index == *(const unsigned *)key; }
static int match_uuid(const struct nvmlDevice_st *g, const void *key) { return strcmp(g->uuid, key) == 0; }
static int match_pci(const struct nvmlDevice_st *g, const void *key) { return same_pci(&g->pci, key); }

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return handle_by(match_index, &index, NVML_ERROR_INVALID_ARGUMENT, device);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    return handle_by(match_index, &index, NVML_ERROR_INVALID_ARGUMENT, device);
}

/* mig_by_uuid finds a MIG device by its UUID, which NVML takes in place of a GPU's. */
static nvmlReturn_t mig_by_uuid(const char *uuid, nvmlDevice_t *device)
{
    pthread_mutex_lock(&mu);
    nvmlReturn_t ret = NVML_ERROR_NOT_FOUND;
    if (refcount == 0)
        ret = NVML_ERROR_UNINITIALIZED;
    for (unsigned i = 0; refcount > 0 && i < prof.ngpus; i++)
        for (unsigned k = 0; k < prof.gpus[i].nmig; k++)
            if (!strcmp(prof.gpus[i].migs[k].uuid, uuid)) {
                ret = gpu_state(&prof.gpus[i]);
                if (ret == NVML_SUCCESS)
                    device->handle = mig_handle(&prof.gpus[i].migs[k]);
                pthread_mutex_unlock(&mu);
                return ret;
            }
    pthread_mutex_unlock(&mu);
    return ret;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!strncmp(uuid, "MIG-", 4))
        return mig_by_uuid(uuid, device);
    return handle_by(match_uuid, uuid, NVML_ERROR_NOT_FOUND, device);
}

static nvmlReturn_t handle_by_pci(const char *pciBusId, nvmlDevice_t *device)
{
    struct pci want;
    if (!pciBusId || parse_bus(pciBusId, &want) != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    return handle_by(match_pci, &want, NVML_ERROR_NOT_FOUND, device);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return handle_by_pci(pciBusId, device);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    return handle_by_pci(pciBusId, device);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    DEVICE_QUERY(device, index, *index = g->index);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    MIG_QUERY(device, uuid, ret_ = copy_out(uuid, length, m ? m->uuid : g->uuid));
}

/* A MIG device is named after its GPU and profile, as NVML does: "NVIDIA H100 80GB HBM3 MIG 1g.10gb". */
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    MIG_QUERY(device, name, {
        char mig_name[STR_LEN + sizeof m->profile + 8];
        if (!(g->has & HAS_NAME)) {
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        } else if (m) {
            snprintf(mig_name, sizeof mig_name, "%s MIG %s", g->name, m->profile);
            ret_ = copy_out(name, length, mig_name);
        } else {
            ret_ = copy_out(name, length, g->name);
        }
    });
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    DEVICE_QUERY(device, minorNumber, *minorNumber = g->minor);
}

/* The compute mode is the GPU's, as MPS sets it; MIG devices have none. */
nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode)
{
    DEVICE_QUERY(device, mode, *mode = (nvmlComputeMode_t)g->compute_mode);
}

nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t device, nvmlComputeMode_t mode)
{
    DEVICE_QUERY(device, 1, {
        if (mode != NVML_COMPUTEMODE_DEFAULT && mode != NVML_COMPUTEMODE_PROHIBITED &&
            mode != NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        else
            g->compute_mode = mode;
    });
}

/* Memory reads all free; a MIG device has its GPU instance's memory. */
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    MIG_QUERY(device, memory, {
        if (!m && !(g->has & HAS_MEMORY)) {
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        } else {
            memory->total = m ? m->memory : g->memory;
            memory->free = memory->total;
            memory->used = 0;
        }
    });
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    MIG_QUERY(device, memory, {
        if (memory->version != nvmlMemory_v2) {
            ret_ = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        } else if (!m && !(g->has & HAS_MEMORY)) {
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        } else {
            memory->total = m ? m->memory : g->memory;
            memory->reserved = 0;
            memory->free = memory->total;
            memory->used = 0;
        }
    });
}

/* fill_pci writes PCI info the way NVML does: upper-case hex, 8-digit domain in busId. */
static void fill_pci(nvmlPciInfo_t *out, const struct pci *p, unsigned pci_id)
{
    memset(out, 0, sizeof *out);
    snprintf(out->busIdLegacy, sizeof out->busIdLegacy, "%04X:%02X:%02X.%X", p->domain & 0xffff, p->bus, p->dev,
             p->fn);
    snprintf(out->busId, sizeof out->busId, "%08X:%02X:%02X.%X", p->domain, p->bus, p->dev, p->fn);
    out->domain = p->domain;
    out->bus = p->bus;
    out->device = p->dev;
    out->pciDeviceId = pci_id;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    DEVICE_QUERY(device, pci, fill_pci(pci, &g->pci, g->pci_id));
}

#ifndef MOCK_R470
nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node)
{
    DEVICE_QUERY(device, node, {
        if (!(g->has & HAS_NUMA))
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        else
            *node = (unsigned)g->numa;
    });
}
#endif

/* pcie_level is the nearest level among the rules that match both GPUs, else SYSTEM. */
static nvmlGpuTopologyLevel_t pcie_level(const struct nvmlDevice_st *a, const struct nvmlDevice_st *b)
{
    if (a == b)
        return NVML_TOPOLOGY_INTERNAL;
    nvmlGpuTopologyLevel_t level = NVML_TOPOLOGY_SYSTEM;
    uint64_t pair = (1ULL << a->index) | (1ULL << b->index);
    for (unsigned i = 0; i < prof.nrules; i++) {
        const struct pcie_rule *r = &prof.rules[i];
        int match = r->same_numa ? ((a->has & b->has & HAS_NUMA) && a->numa == b->numa) : (r->members & pair) == pair;
        if (match && r->level < level)
            level = r->level;
    }
    return level;
}

/* nvlinked says whether two GPUs reach each other over NVLink, directly or through a shared switch. */
static int nvlinked(const struct nvmlDevice_st *a, const struct nvmlDevice_st *b)
{
    for (unsigned i = 0; i < a->nlinks; i++) {
        const struct link_end *ea = &a->links[i];
        if (ea->is_gpu && ea->id == b->index)
            return 1;
        if (ea->is_gpu)
            continue;
        for (unsigned j = 0; j < b->nlinks; j++)
            if (!b->links[j].is_gpu && b->links[j].id == ea->id)
                return 1;
    }
    for (unsigned j = 0; j < b->nlinks; j++)
        if (b->links[j].is_gpu && b->links[j].id == a->index)
            return 1;
    return 0;
}

/* device_pair begins a call on two handles; on success the caller must device_end. */
static nvmlReturn_t device_pair(nvmlDevice_t d1, nvmlDevice_t d2)
{
    pthread_mutex_lock(&mu);
    nvmlReturn_t ret = device_check(d1.handle);
    if (ret == NVML_SUCCESS)
        ret = device_check(d2.handle);
    if (ret != NVML_SUCCESS)
        pthread_mutex_unlock(&mu);
    return ret;
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                 nvmlGpuTopologyLevel_t *pathInfo)
{
    nvmlReturn_t ret = device_pair(device1, device2);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!pathInfo)
        return device_end(NVML_ERROR_INVALID_ARGUMENT);
    *pathInfo = pcie_level(device1.handle, device2.handle);
    return device_end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2, nvmlGpuP2PCapsIndex_t p2pIndex,
                                    nvmlGpuP2PStatus_t *p2pStatus)
{
    nvmlReturn_t ret = device_pair(device1, device2);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!p2pStatus || p2pIndex >= NVML_P2P_CAPS_INDEX_UNKNOWN)
        return device_end(NVML_ERROR_INVALID_ARGUMENT);
    const struct nvmlDevice_st *a = device1.handle, *b = device2.handle;
    int linked = a == b || nvlinked(a, b);
    if (p2pIndex == NVML_P2P_CAPS_INDEX_NVLINK)
        *p2pStatus = linked ? NVML_P2P_STATUS_OK : NVML_P2P_STATUS_NOT_SUPPORTED;
    else /* over PCIe, peer traffic stops at the host bridge */
        *p2pStatus = linked || pcie_level(a, b) <= NVML_TOPOLOGY_HOSTBRIDGE ? NVML_P2P_STATUS_OK
                                                                            : NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED;
    return device_end(NVML_SUCCESS);
}

/* link_check validates an NVLink number: NOT_SUPPORTED without NVLink, INVALID_ARGUMENT past the last. */
static nvmlReturn_t link_check(const struct nvmlDevice_st *g, unsigned int link)
{
    if (g->nlinks == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= g->nlinks)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive)
{
    DEVICE_QUERY(device, isActive, {
        ret_ = link_check(g, link);
        if (ret_ == NVML_SUCCESS)
            *isActive = NVML_FEATURE_ENABLED;
    });
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    DEVICE_QUERY(device, pci, {
        ret_ = link_check(g, link);
        if (ret_ == NVML_SUCCESS) {
            const struct link_end *e = &g->links[link];
            if (e->is_gpu)
                fill_pci(pci, &prof.gpus[e->id].pci, prof.gpus[e->id].pci_id);
            else
                fill_pci(pci, &prof.switches[e->id].pci, NVSWITCH_PCI_ID);
        }
    });
}

nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                 nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType)
{
    DEVICE_QUERY(device, pNvLinkDeviceType, {
        ret_ = link_check(g, link);
        if (ret_ == NVML_SUCCESS)
            *pNvLinkDeviceType = g->links[link].is_gpu ? NVML_NVLINK_DEVICE_TYPE_GPU : NVML_NVLINK_DEVICE_TYPE_SWITCH;
    });
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp)
{
    DEVICE_QUERY(device, temp, {
        if (sensorType != NVML_TEMPERATURE_GPU)
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        else if (!g->has_temp || (g->unsupported & UNSUP_TEMP))
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        else
            *temp = g->cur_temp;
    });
}

#ifndef MOCK_R470
nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature)
{
    DEVICE_QUERY(device, temperature, {
        if (temperature->version != nvmlTemperature_v1)
            ret_ = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        else if (temperature->sensorType != NVML_TEMPERATURE_GPU)
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        else if (!g->has_temp || (g->unsupported & UNSUP_TEMP))
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        else
            temperature->temperature = (int)g->cur_temp;
    });
}
#endif

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, nvmlTemperatureThresholds_t thresholdType,
                                               unsigned int *temp)
{
    DEVICE_QUERY(device, temp, {
        unsigned flag = 0, v = 0;
        switch (thresholdType) {
        case NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: flag = HAS_SHUTDOWN; v = g->shutdown; break;
        case NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: flag = HAS_SLOWDOWN; v = g->slowdown; break;
        case NVML_TEMPERATURE_THRESHOLD_GPU_MAX: flag = HAS_MAXTEMP; v = g->maxtemp; break;
        default: break;
        }
        if (thresholdType >= NVML_TEMPERATURE_THRESHOLD_COUNT)
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        else if (!(g->has & flag))
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        else
            *temp = v;
    });
}

static nvmlReturn_t clock_reasons(nvmlDevice_t device, unsigned long long *out)
{
    DEVICE_QUERY(device, out, {
        if (g->unsupported & UNSUP_THROTTLE)
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        else
            *out = g->cur_throttle;
    });
}

#ifndef MOCK_R470
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *clocksEventReasons)
{
    return clock_reasons(device, clocksEventReasons);
}
#endif

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *clocksThrottleReasons)
{
    return clock_reasons(device, clocksThrottleReasons);
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    DEVICE_QUERY(device, currentMode && pendingMode, {
        if (!(g->has & HAS_MIG))
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        else
            *currentMode = *pendingMode = g->mig;
    });
}

/* ------------------------------------------------------------------- MIG */

/* MIG-capable GPUs (with a mig key) hold up to seven MIG devices while MIG is on, none while it is off. */
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    DEVICE_QUERY(device, count, {
        if (!(g->has & HAS_MIG))
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        else
            *count = g->mig ? MAX_MIG : 0;
    });
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice)
{
    DEVICE_QUERY(device, migDevice, {
        if (!(g->has & HAS_MIG))
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        else if (index >= (g->mig ? MAX_MIG : 0))
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        else if (index >= g->nmig)
            ret_ = NVML_ERROR_NOT_FOUND; /* an empty slot */
        else
            migDevice->handle = mig_handle(&g->migs[index]);
    });
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    MIG_QUERY(device, isMigDevice, *isMigDevice = m != NULL);
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    MIG_QUERY(migDevice, device, {
        if (!m)
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        else
            device->handle = g;
    });
}

/* The instance ids are a MIG device's; a GPU's handle is the wrong argument. */
nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    MIG_QUERY(device, id, {
        if (!m)
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        else
            *id = m->gi;
    });
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    MIG_QUERY(device, id, {
        if (!m)
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        else
            *id = m->ci;
    });
}

/* Attributes are answered for MIG devices only, as nvml.h says; engine counts read 0. */
nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    MIG_QUERY(device, attributes, {
        if (!m) {
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        } else {
            memset(attributes, 0, sizeof *attributes);
            attributes->multiprocessorCount = m->sms;
            attributes->gpuInstanceSliceCount = m->slices;
            attributes->computeInstanceSliceCount = m->cislices;
            attributes->memorySizeMB = m->memory >> 20;
        }
    });
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gpuInstance)
{
    DEVICE_QUERY(device, gpuInstance, {
        ret_ = NVML_ERROR_NOT_FOUND;
        if (!(g->has & HAS_MIG) || !g->mig)
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        for (unsigned k = 0; ret_ == NVML_ERROR_NOT_FOUND && k < g->ngis; k++)
            if (g->gis[k].id == id) {
                gpuInstance->handle = &g->gis[k];
                ret_ = NVML_SUCCESS;
            }
    });
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info)
{
    pthread_mutex_lock(&mu);
    if (refcount == 0)
        return device_end(NVML_ERROR_UNINITIALIZED);
    unsigned k;
    struct nvmlDevice_st *g =
        member_of(gpuInstance.handle, offsetof(struct nvmlDevice_st, gis), sizeof g->gis[0], gi_count, &k);
    if (!g || !info)
        return device_end(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t ret = gpu_state(g);
    if (ret == NVML_SUCCESS) {
        const struct nvmlGpuInstance_st *gi = &g->gis[k];
        memset(info, 0, sizeof *info);
        info->device.handle = g;
        info->id = gi->id;
        info->profileId = gi->profile_id;
        info->placement.start = gi->start;
        info->placement.size = gi->size;
    }
    return device_end(ret);
}

/*
 * gi_profile_of finds GPU g's profile at index: INVALID_ARGUMENT past the
 * indices nvml.h knows (how NVML ends a forward-compatible walk),
 * NOT_SUPPORTED for one the GPU lacks and on a GPU without MIG on.
 */
static nvmlReturn_t gi_profile_of(const struct nvmlDevice_st *g, unsigned index, const struct gi_profile **p)
{
    if (index >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!(g->has & HAS_MIG) || !g->mig || !(*p = gi_profile(index)))
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

/* Profile memory in MiB: its eighths of the GPU's (an eighth per slice without a memory key). */
static unsigned long long gi_profile_mib(const struct nvmlDevice_st *g, const struct gi_profile *p)
{
    return (g->has & HAS_MEMORY) ? (g->memory >> 20) * p->eighths / 8 : 1024ULL * p->eighths;
}

/* Profile info: ID, slices, instances and memory; no engines, no SMs, an empty name. */
nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                 nvmlGpuInstanceProfileInfo_t *info)
{
    DEVICE_QUERY(device, info, {
        const struct gi_profile *p = NULL;
        ret_ = gi_profile_of(g, profile, &p);
        if (ret_ == NVML_SUCCESS) {
            memset(info, 0, sizeof *info);
            info->id = p->id;
            info->sliceCount = p->slices;
            info->instanceCount = p->instances;
            info->memorySizeMB = gi_profile_mib(g, p);
        }
    });
}

#ifndef MOCK_R470
/* The versioned call (R510): v2 and v3 differ in layout, so each is filled as its own. */
nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                  nvmlGpuInstanceProfileInfo_v2_t *info)
{
    DEVICE_QUERY(device, info, {
        const struct gi_profile *p = NULL;
        unsigned version = info->version;
        if (version != nvmlGpuInstanceProfileInfo_v2 && version != nvmlGpuInstanceProfileInfo_v3)
            ret_ = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        else
            ret_ = gi_profile_of(g, profile, &p);
        if (ret_ == NVML_SUCCESS && version == nvmlGpuInstanceProfileInfo_v2) {
            memset(info, 0, sizeof *info);
            info->version = version;
            info->id = p->id;
            info->sliceCount = p->slices;
            info->instanceCount = p->instances;
            info->memorySizeMB = gi_profile_mib(g, p);
        } else if (ret_ == NVML_SUCCESS) {
            nvmlGpuInstanceProfileInfo_v3_t *v3 = (nvmlGpuInstanceProfileInfo_v3_t *)info;
            memset(v3, 0, sizeof *v3);
            v3->version = version;
            v3->id = p->id;
            v3->sliceCount = p->slices;
            v3->instanceCount = p->instances;
            v3->memorySizeMB = gi_profile_mib(g, p);
        }
    });
}
#endif

/* ------------------------------------------------------- compute instances */

/*
 * A MIG device is one compute instance of a GPU instance. Compute instance
 * handles point at the mig_dev (as MIG device handles do, under another
 * type); compute instance profile IDs are the profile indices
 * (NVML_COMPUTE_INSTANCE_PROFILE_*), as nvidia-smi mig -lcip shows them.
 */

/* gi_of resolves a GPU instance handle to its GPU and instance; call with mu held. */
static nvmlReturn_t gi_of(nvmlGpuInstance_t gpuInstance, struct nvmlDevice_st **gpu, struct nvmlGpuInstance_st **gi)
{
    if (refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    unsigned k;
    struct nvmlDevice_st *g =
        member_of(gpuInstance.handle, offsetof(struct nvmlDevice_st, gis), sizeof g->gis[0], gi_count, &k);
    if (!g)
        return NVML_ERROR_INVALID_ARGUMENT;
    *gpu = g;
    *gi = &g->gis[k];
    return gpu_state(g);
}

/* ci_profile_index is the compute instance profile of a compute instance of that many slices. */
static unsigned ci_profile_index(unsigned slices)
{
    switch (slices) {
    case 1: return NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE;
    case 2: return NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE;
    case 3: return NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE;
    case 4: return NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE;
    case 6: return NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE;
    case 7: return NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE;
    default: return NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE;
    }
}

/*
 * Compute instance profile info within a GPU instance of gi->slices slices,
 * as an A100 or H100 offers them: the whole instance, 1c and 2c in any larger
 * one, 3c and 4c in the 7-slice one; NOT_SUPPORTED for the rest,
 * INVALID_ARGUMENT past the indices nvml.h knows or for an engine profile
 * other than SHARED. SM and engine counts read 0, as the GPU instance
 * profiles' do.
 */
nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                          unsigned int engProfile,
                                                          nvmlComputeInstanceProfileInfo_t *info)
{
    pthread_mutex_lock(&mu);
    struct nvmlDevice_st *g;
    struct nvmlGpuInstance_st *gi;
    nvmlReturn_t ret = gi_of(gpuInstance, &g, &gi);
    if (ret != NVML_SUCCESS)
        return device_end(ret);
    if (!info || profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT ||
        engProfile >= NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT)
        return device_end(NVML_ERROR_INVALID_ARGUMENT);
    static const unsigned slices_of[] = {
        [NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE] = 1, [NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE] = 2,
        [NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE] = 3, [NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE] = 4,
        [NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE] = 7,
    };
    unsigned c = profile < sizeof slices_of / sizeof slices_of[0] ? slices_of[profile] : 0;
    unsigned s = gi->slices;
    if (c == 0 || !(c == s || (c <= 2 && c < s) || (c <= 4 && s == MIG_SLICES)))
        return device_end(NVML_ERROR_NOT_SUPPORTED);
    memset(info, 0, sizeof *info);
    info->id = profile;
    info->sliceCount = c;
    info->instanceCount = s / c;
    return device_end(NVML_SUCCESS);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance, unsigned int id,
                                                   nvmlComputeInstance_t *computeInstance)
{
    pthread_mutex_lock(&mu);
    struct nvmlDevice_st *g;
    struct nvmlGpuInstance_st *gi;
    nvmlReturn_t ret = gi_of(gpuInstance, &g, &gi);
    if (ret != NVML_SUCCESS)
        return device_end(ret);
    if (!computeInstance)
        return device_end(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned k = 0; k < g->nmig; k++)
        if (g->migs[k].gi == gi->id && g->migs[k].ci == id) {
            computeInstance->handle = (struct nvmlComputeInstance_st *)(void *)&g->migs[k];
            return device_end(NVML_SUCCESS);
        }
    return device_end(NVML_ERROR_NOT_FOUND);
}

/*
 * The compute instance's GPU, GPU instance, id, profile and placement: its
 * GPU instance's compute slices are handed out in the order of the mig lines.
 * Only the v2 call: v1's struct lacks the placement.
 */
nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t *info)
{
    pthread_mutex_lock(&mu);
    if (refcount == 0)
        return device_end(NVML_ERROR_UNINITIALIZED);
    unsigned k;
    struct nvmlDevice_st *g =
        member_of(computeInstance.handle, offsetof(struct nvmlDevice_st, migs), sizeof g->migs[0], mig_count, &k);
    if (!g || !info)
        return device_end(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t ret = gpu_state(g);
    if (ret != NVML_SUCCESS)
        return device_end(ret);
    const struct mig_dev *m = &g->migs[k];
    memset(info, 0, sizeof *info);
    info->device.handle = g;
    for (unsigned j = 0; j < g->ngis; j++)
        if (g->gis[j].id == m->gi)
            info->gpuInstance.handle = &g->gis[j];
    info->id = m->ci;
    info->profileId = ci_profile_index(m->cislices);
    for (unsigned j = 0; j < k; j++)
        if (g->migs[j].gi == m->gi)
            info->placement.start += g->migs[j].cislices;
    info->placement.size = m->cislices;
    return device_end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                       unsigned int *isPending, unsigned int *failureOccurred)
{
    DEVICE_QUERY(device, corrRows && uncRows && isPending && failureOccurred, {
        if (g->unsupported & UNSUP_REMAP) {
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        } else {
            *corrRows = 0;
            *uncRows = (g->remap_pending || g->remap_failure) ? 1 : 0;
            *isPending = (unsigned)g->remap_pending;
            *failureOccurred = (unsigned)g->remap_failure;
        }
    });
}

/* Only the recovery action is a field here; every other answers NOT_SUPPORTED. */
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values)
{
    DEVICE_QUERY(device, values && valuesCount > 0, {
        for (int k = 0; k < valuesCount; k++) {
            nvmlFieldValue_t *v = &values[k];
            memset(&v->value, 0, sizeof v->value);
            v->timestamp = 0;
            v->latencyUsec = 0;
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            if (v->fieldId != NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)
                continue;
#ifdef MOCK_R470
            v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT; /* a field id R470 does not know */
#else
            if (!(g->unsupported & UNSUP_RECOVERY)) {
                v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
                v->value.uiVal = g->recovery;
                v->nvmlReturn = NVML_SUCCESS;
            }
#endif
        }
    });
}

nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch)
{
    DEVICE_QUERY(device, arch, {
        if (!(g->has & HAS_ARCH))
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        else
            *arch = g->arch;
    });
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    DEVICE_QUERY(device, major && minor, {
        if (!(g->has & HAS_CC)) {
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        } else {
            *major = g->cc_major;
            *minor = g->cc_minor;
        }
    });
}

nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *type)
{
    DEVICE_QUERY(device, type, {
        if (!(g->has & HAS_BRAND))
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        else
            *type = (nvmlBrandType_t)g->brand;
    });
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    DEVICE_QUERY(device, eventTypes, *eventTypes = SUPPORTED_EVENTS);
}

/* ---------------------------------------------------------------- event sets */

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct nvmlEventSet_st *s = calloc(1, sizeof *s);
    if (!s)
        return NVML_ERROR_MEMORY;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cond, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_lock(&mu);
    if (refcount == 0) {
        pthread_mutex_unlock(&mu);
        set_destroy(s);
        return NVML_ERROR_UNINITIALIZED;
    }
    s->next = sets;
    sets = s;
    set->handle = s;
    pthread_mutex_unlock(&mu);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    nvmlReturn_t ret = device_begin(device);
    if (ret != NVML_SUCCESS)
        return ret;
    struct nvmlEventSet_st *s = set_find(set.handle);
    if (!s)
        return device_end(NVML_ERROR_INVALID_ARGUMENT);
    if (eventTypes & ~(unsigned long long)SUPPORTED_EVENTS)
        return device_end(NVML_ERROR_NOT_SUPPORTED);
    s->mask[device.handle->index] |= eventTypes;
    return device_end(NVML_SUCCESS);
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    if (!data)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += timeoutms / 1000;
    deadline.tv_nsec += (long)(timeoutms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }

    pthread_mutex_lock(&mu);
    if (refcount == 0) {
        pthread_mutex_unlock(&mu);
        return NVML_ERROR_UNINITIALIZED;
    }
    struct nvmlEventSet_st *s = set_find(set.handle);
    if (!s) {
        pthread_mutex_unlock(&mu);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    unsigned long gen = generation;
    s->waiters++;
    while (s->len == 0 && !s->freed)
        if (pthread_cond_timedwait(&s->cond, &mu, &deadline) == ETIMEDOUT)
            break;
    s->waiters--;
    nvmlReturn_t ret;
    if (gen != generation) {
        ret = NVML_ERROR_UNINITIALIZED; /* nvmlShutdown while waiting */
    } else if (s->freed) {
        ret = NVML_ERROR_INVALID_ARGUMENT; /* nvmlEventSetFree while waiting */
    } else if (s->len == 0) {
        ret = NVML_ERROR_TIMEOUT;
    } else {
        struct event e = s->queue[s->head];
        s->head = (s->head + 1) % QUEUE_LEN;
        s->len--;
        data->device.handle = &prof.gpus[e.gpu];
        data->eventType = e.type;
        data->eventData = e.data;
        data->gpuInstanceId = e.gi;
        data->computeInstanceId = e.ci;
        ret = NVML_SUCCESS;
    }
    if (s->freed && s->waiters == 0)
        set_destroy(s);
    pthread_mutex_unlock(&mu);
    return ret;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    pthread_mutex_lock(&mu);
    nvmlReturn_t ret = NVML_SUCCESS;
    struct nvmlEventSet_st *s = set_find(set.handle);
    if (refcount == 0)
        ret = NVML_ERROR_UNINITIALIZED;
    else if (!s)
        ret = NVML_ERROR_INVALID_ARGUMENT;
    else
        set_unlink(s);
    pthread_mutex_unlock(&mu);
    return ret;
}

/* ------------------------------------------------------------------ stubs */

/*
 * Neighbours of the calls above that a plugin might reach for next. They
 * answer NOT_SUPPORTED rather than leave the symbol unresolved, which would
 * abort the process at the first call.
 */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#ifndef MOCK_R470
nvmlReturn_t nvmlSystemGetDriverBranch(nvmlSystemDriverBranchInfo_t *branchInfo, unsigned int length) { return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetHandleByUUIDV(const nvmlUUID_t *uuid, nvmlDevice_t *device) { return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t device, nvmlPciInfoExt_t *pci) { return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t device, unsigned long long *supportedClocksEventReasons) { return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos) { return NVML_ERROR_NOT_SUPPORTED; }
#endif
nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device) { return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) { return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) { return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) { return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode) { return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType, nvmlEccCounterType_t counterType, unsigned long long *eccCounts) { return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending) { return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link, unsigned int *version) { return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize, unsigned long *cpuSet) { return NVML_ERROR_NOT_SUPPORTED; }
#pragma GCC diagnostic pop
