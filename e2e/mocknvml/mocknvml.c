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
 * control thread or a waiter still leaving our code); a MIG instance's
 * handle points at its slot, which the library tells is live or not. MIG
 * instances can be created and destroyed, and kept in a file shared between
 * processes (MOCK_NVML_MIG_STATE, under an flock); see "MIG" below.
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
#include <sys/file.h>
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
#define MAX_PROCS 32       /* processes a GPU can list, per kind (compute, graphics) */

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
    HAS_FABRIC = 1 << 14,
    HAS_VGPU = 1 << 15, /* a vGPU guest's GPU (vgpuhost=) */
};

/* Signals a GPU answers NOT_SUPPORTED to (profile key unsupported=). */
enum {
    UNSUP_TEMP = 1 << 0,     /* temperature, both calls */
    UNSUP_THROTTLE = 1 << 1, /* clocks event (throttle) reasons, both calls */
    UNSUP_RECOVERY = 1 << 2, /* the recovery-action field */
    UNSUP_REMAP = 1 << 3,    /* remapped rows */
    UNSUP_DRAIN = 1 << 4,    /* drain state, removal and rediscovery (vGPU guests) */
    UNSUP_PROCS = 1 << 5,    /* running process lists */
};

struct pci {
    unsigned domain, bus, dev, fn;
};

/* A process with a context on a GPU, as the running-process calls list it. */
struct proc {
    unsigned pid;
    unsigned long long memory; /* bytes */
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
 * holds, and what the create and placement calls take). IDs are not
 * indices, as on a real GPU. Memory is in eighths, the GPU's memory slices;
 * placements are the memory slices an instance may start at, one bit per
 * start, as nvidia-smi mig -lgipp lists them on an A100 or H100 (NVIDIA's
 * MIG user guide). sms are an H100 80GB's.
 */
struct gi_profile {
    unsigned index, id, slices, instances, eighths;
    unsigned placements;
    unsigned sms;
    const char *suffix; /* after "<slices>g.<GiB>gb" in the profile's name */
};
static const struct gi_profile gi_profiles[] = {
    {NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 7, 1, 0x7f, 16, ""},         /* 1g.10gb {0..6}:1 */
    {NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 1, 1, 0x7f, 16, "+me"}, /* 1g.10gb+me {0..6}:1 */
    {NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 4, 2, 0x55, 26, ""},    /* 1g.20gb {0,2,4,6}:2 */
    {NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 3, 2, 0x15, 32, ""},         /* 2g.20gb {0,2,4}:2 */
    {NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 2, 4, 0x11, 60, ""},          /* 3g.40gb {0,4}:4 */
    {NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 1, 4, 0x01, 64, ""},          /* 4g.40gb {0}:4 */
    {NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 1, 8, 0x01, 132, ""},         /* 7g.80gb {0}:8 */
};
#define N_GI_PROFILES (sizeof gi_profiles / sizeof gi_profiles[0])
#define MEM_SLICES 8 /* memory slices (eighths) of a MIG GPU */

static const struct gi_profile *gi_profile(unsigned index)
{
    for (size_t k = 0; k < N_GI_PROFILES; k++)
        if (gi_profiles[k].index == index)
            return &gi_profiles[k];
    return NULL;
}

static const struct gi_profile *gi_profile_by_id(unsigned id)
{
    for (size_t k = 0; k < N_GI_PROFILES; k++)
        if (gi_profiles[k].id == id)
            return &gi_profiles[k];
    return NULL;
}

/*
 * GPU instance ids follow the placement, as the driver's do (its "swizzle
 * ids", which the MIG user guide's nvidia-smi examples show): 0 is the
 * whole GPU, 1 and 2 the halves of memory from slice 0 and 4, 3 to 6 the
 * quarters from 0, 2, 4 and 6, 7 to 14 the eighths from 0 to 7. So a
 * 3g.40gb at 4:4 is gi2 whenever it is created, a 1g.10gb at 0:1 gi7.
 */
static unsigned gi_id_at(const struct gi_profile *p, unsigned start)
{
    switch (p->eighths) {
    case 8: return 0;
    case 4: return 1 + start / 4;
    case 2: return 3 + start / 2;
    default: return 7 + start;
    }
}

/* gi_start_of is the placement start of GPU instance id of profile p; -1 if no such instance can have that id. */
static int gi_start_of(const struct gi_profile *p, unsigned id, unsigned *start)
{
    for (unsigned s = 0; s < MEM_SLICES; s++)
        if ((p->placements >> s & 1) && gi_id_at(p, s) == id) {
            *start = s;
            return 0;
        }
    return -1;
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

/* gi_ids names the ids a profile's instances can have, for messages. */
static const char *gi_ids(const struct gi_profile *p)
{
    switch (p->placements) {
    case 0x7f: return "7 to 13";
    case 0x55: return "3 to 6";
    case 0x15: return "3 to 5";
    case 0x11: return "1 or 2";
    default: return p->eighths == 8 ? "0" : "1";
    }
}

/*
 * One MIG device (a compute instance) that the driver holds: declared by a
 * mig line of the profile, created through NVML, or read from the state
 * file. Its slot in a GPU's migs array is its MIG device index.
 */
struct mig_dev {
    int used;
    unsigned gi, ci, giprofile, slices, cislices, sms;
    unsigned ci_profile, ci_start; /* compute instance profile ID; placement in the GPU instance's compute slices */
    unsigned long long memory;     /* bytes: its GPU instance's */
    char uuid[STR_LEN], profile[32];
};

/* A GPU instance: what nvmlDeviceGetGpuInstanceById hands out. */
struct nvmlGpuInstance_st {
    int used;
    unsigned gpu; /* the parent's index */
    unsigned id, profile_id, giprofile, slices;
    unsigned start, size;      /* placement, in memory slices */
    unsigned long long memory; /* bytes */
};

/*
 * A GPU. Its MIG devices and GPU instances live inside it, so their handles
 * (pointers to migs[k] and gis[k]) are distinct, stable while the instance
 * lives, and map back to the GPU by address; a MIG handle is an nvmlDevice_t
 * that points at a mig_dev.
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
    /* Fabric registration, with HAS_FABRIC (profile key fabric=). */
    unsigned char fabric_uuid[16];
    unsigned fabric_clique, fabric_state;
    nvmlReturn_t fabric_status;
    unsigned mig;         /* MIG mode, with HAS_MIG */
    unsigned nmig, ngis;  /* the profile's mig lines and the GPU instances they name */
    struct mig_dev decl_migs[MAX_MIG];           /* by MIG device index: the order of the mig lines */
    struct nvmlGpuInstance_st decl_gis[MAX_MIG]; /* in the order the mig lines name them */
    /* What the driver holds now: the declared instances, or the state file's, changed by create and destroy. */
    struct mig_dev migs[MAX_MIG];           /* by MIG device index; used marks a live one */
    struct nvmlGpuInstance_st gis[MAX_MIG]; /* slots, kept while the instance lives */
    int in_state;                           /* the state file holds this GPU's instances */
    /* Injected at run time. */
    int lost;
    int has_temp;
    unsigned cur_temp;
    unsigned long long cur_throttle;
    unsigned recovery;                 /* nvmlDeviceGpuRecoveryAction_t */
    int remap_pending, remap_failure;  /* remapped rows */
    unsigned transient;                /* device calls left to answer UNKNOWN */
    unsigned compute_mode;             /* nvmlComputeMode_t, kept until the library unloads */
    unsigned mig_pause;                /* MIG_PAUSE_*: how the next compute instance creation stops */
    unsigned mig_paused;               /* creations stopped now */
    unsigned long mig_resumes;         /* mig-create-resume count: wakes the stopped ones */
    unsigned mig_fail;                 /* MIG_FAIL_*: the next creation fails */
    struct proc procs[2][MAX_PROCS];   /* PROCS_COMPUTE, PROCS_GRAPHICS: what runs on it (procs command) */
    unsigned nprocs[2];
    int persistence;                   /* persistence mode on: an attachment, so no drain or removal */
    int draining;                      /* nvmlDeviceModifyDrainState */
    int removed;                       /* nvmlDeviceRemoveGpu: out of NVML's view until nvmlDeviceDiscoverGpus */
    unsigned reset_fail;               /* RESET_FAIL_*: the next removal or rediscovery fails (resetfail) */
    int comeback_broken;               /* comebackbroken: rediscovered with comeback_action set */
    unsigned comeback_action;          /* nvmlDeviceGpuRecoveryAction_t */
    unsigned reset_pause;              /* RESET_PAUSE_*: where the next removal or rediscovery stops (reset-pause) */
    unsigned reset_paused;             /* removals or rediscoveries stopped now */
    unsigned long reset_resumes;       /* reset-resume count: wakes the stopped ones */
};

/* procs: the kinds of process a GPU lists. */
enum { PROCS_COMPUTE, PROCS_GRAPHICS };
/* resetfail: which step of a reset fails next. */
enum { RESET_FAIL_NONE, RESET_FAIL_ANY, RESET_FAIL_REMOVE, RESET_FAIL_DISCOVER };
/* reset-pause: which step of a reset on a GPU stops next until resumed. */
enum { RESET_PAUSE_NONE, RESET_PAUSE_REMOVE, RESET_PAUSE_DISCOVER };

/* mig-create-pause: where the next compute instance creation on a GPU stops until resumed. */
enum { MIG_PAUSE_NONE, MIG_PAUSE_BEFORE, MIG_PAUSE_AFTER };
/* mig-create-fail: which creation on a GPU fails next. */
enum { MIG_FAIL_NONE, MIG_FAIL_ANY, MIG_FAIL_GI, MIG_FAIL_CI };

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
static int unprivileged;              /* "unprivileged" injected: calls that need root answer NO_PERMISSION */
static struct nvmlEventSet_st *sets;  /* live event sets */
static FILE *log_file;                    /* MOCK_NVML_LOG, or NULL */

/* Identifies a version of a file: a rewrite by rename changes the inode, an edit in place the size or time. */
struct file_id {
    int exists;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
};

/* MIG instances: see "MIG" below. Guarded by mu. */
static char state_path[4096];            /* MOCK_NVML_MIG_STATE, or empty */
static char proc_root[4096];             /* MOCK_NVML_PROC_ROOT, or empty */
static struct file_id state_seen;        /* the state file's version last read or written */
static unsigned long long mig_counter;   /* compute instances created: part of each new UUID */
static pthread_cond_t mig_cond = PTHREAD_COND_INITIALIZER; /* a creation, removal or rediscovery paused or resumed */
/* Drain states and removals: see "Drain states" below. Guarded by mu. */
static char drain_path[4096]; /* MOCK_NVML_DRAIN_STATE, or empty */
static int control_stopping;             /* the control thread is asked to stop */

static void set_declared(struct nvmlDevice_st *g);
static int state_reload(int force, char *err, size_t len);
static void mig_sync(void);
static int drain_load(char *err, size_t len);

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

/* parse_unsupported reads "temp,throttle,recovery,remap,drain,procs" or "none". */
static int parse_unsupported(struct parser *ps, const char *val, unsigned *out)
{
    static const struct {
        const char *name;
        unsigned bit;
    } names[] = {{"temp", UNSUP_TEMP},   {"throttle", UNSUP_THROTTLE}, {"recovery", UNSUP_RECOVERY},
                 {"remap", UNSUP_REMAP}, {"drain", UNSUP_DRAIN},       {"procs", UNSUP_PROCS}};
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
            return fail_at(ps, "unsupported: %s is not one of temp throttle recovery remap drain procs", item);
        *out |= names[i].bit;
    }
    if (*out == 0)
        return fail_at(ps, "unsupported: empty list (write unsupported=none for none)");
    return 0;
}

/* parse_gpu_keys applies key=value tokens to g; identity keys only when allowed. */
/*
 * parse_fabric reads fabric=<cluster UUID>:<clique ID>[:<state>], the state
 * completed (the default), in-progress, not-started or failed (completed,
 * status NVML_ERROR_UNKNOWN: a registration the fabric manager refused).
 */
static int parse_fabric(struct parser *ps, const char *val, struct nvmlDevice_st *g)
{
    char buf[STR_LEN];
    if (strlen(val) >= sizeof buf)
        return fail_at(ps, "fabric %.40s... is too long", val);
    strcpy(buf, val);
    char *clique = strchr(buf, ':');
    if (!clique)
        return fail_at(ps, "fabric %s is not <cluster UUID>:<clique ID>[:<state>]", val);
    *clique++ = '\0';
    char *state = strchr(clique, ':');
    if (state)
        *state++ = '\0';
    /* 8-4-4-4-12 hex digits. */
    static const int groups[] = {8, 4, 4, 4, 12};
    const char *c = buf;
    unsigned n = 0;
    for (int gi = 0; gi < 5; gi++) {
        for (int k = 0; k < groups[gi]; k += 2) {
            unsigned hi, lo;
            if (!isxdigit((unsigned char)c[0]) || !isxdigit((unsigned char)c[1]))
                return fail_at(ps, "fabric: cluster UUID %s is not 8-4-4-4-12 hex digits", buf);
            hi = isdigit((unsigned char)c[0]) ? (unsigned)(c[0] - '0') : (unsigned)(tolower((unsigned char)c[0]) - 'a' + 10);
            lo = isdigit((unsigned char)c[1]) ? (unsigned)(c[1] - '0') : (unsigned)(tolower((unsigned char)c[1]) - 'a' + 10);
            g->fabric_uuid[n++] = (unsigned char)(hi << 4 | lo);
            c += 2;
        }
        if (gi < 4 && *c++ != '-')
            return fail_at(ps, "fabric: cluster UUID %s is not 8-4-4-4-12 hex digits", buf);
    }
    if (*c != '\0')
        return fail_at(ps, "fabric: cluster UUID %s is not 8-4-4-4-12 hex digits", buf);
    unsigned long long v;
    if (parse_uint(clique, 10, 0xffffffffULL, &v))
        return fail_at(ps, "fabric: clique ID %s is not a number", clique);
    g->fabric_clique = (unsigned)v;
    g->fabric_state = NVML_GPU_FABRIC_STATE_COMPLETED;
    g->fabric_status = NVML_SUCCESS;
    if (state && !strcmp(state, "in-progress"))
        g->fabric_state = NVML_GPU_FABRIC_STATE_IN_PROGRESS, g->fabric_status = NVML_ERROR_NOT_READY;
    else if (state && !strcmp(state, "not-started"))
        g->fabric_state = NVML_GPU_FABRIC_STATE_NOT_STARTED, g->fabric_status = NVML_ERROR_NOT_READY;
    else if (state && !strcmp(state, "failed"))
        g->fabric_status = NVML_ERROR_UNKNOWN;
    else if (state && strcmp(state, "completed") != 0)
        return fail_at(ps, "fabric: state %s is not one of completed in-progress not-started failed", state);
    g->has |= HAS_FABRIC;
    return 0;
}

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
        } else if (!strcmp(key, "fabric")) {
            if (parse_fabric(ps, val, g))
                return -1;
        } else if (!strcmp(key, "vgpuhost")) {
            /* The host's driver, in the PCI config space the Go side writes
             * (WriteSysfs): NVML does not say it, only that the GPU is a
             * vGPU (its virtualization mode). */
            g->has |= HAS_VGPU;
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
            if (!strcmp(p->gpus[i].decl_migs[j].uuid, m.uuid))
                return fail_at(ps, "mig %llu: uuid %s is also gpu %u's MIG device %u", idx, m.uuid, i, j);
    unsigned ci_slices = m.cislices;
    for (unsigned j = 0; j < g->nmig; j++) {
        const struct mig_dev *o = &g->decl_migs[j];
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
    /* Compute slices go to the compute instances in line order. */
    m.ci_start = ci_slices - m.cislices;
    m.ci_profile = ci_profile_index(m.cislices);
    /* Slices bound the counts (a CI takes at least one), so the arrays cannot overflow. */
    if (g->nmig == MAX_MIG)
        return fail_at(ps, "mig %llu: more than %d MIG devices", idx, MAX_MIG);
    unsigned k = 0;
    while (k < g->ngis && g->decl_gis[k].id != m.gi)
        k++;
    if (k == g->ngis) { /* the first line of this GPU instance */
        const struct gi_profile *gp = gi_profile(m.giprofile);
        unsigned gi_slices = m.slices, same = 0, start;
        for (unsigned j = 0; j < g->ngis; j++) {
            gi_slices += g->decl_gis[j].slices;
            same += g->decl_gis[j].giprofile == m.giprofile;
        }
        if (gi_slices > MIG_SLICES)
            return fail_at(ps, "mig %llu: its GPU instances take more than %d slices", idx, MIG_SLICES);
        /* The id says where the instance lies, as the driver numbers them. */
        if (gi_start_of(gp, m.gi, &start))
            return fail_at(ps, "mig %llu: gi %u is not an id a giprofile %u GPU instance has (%s)", idx, m.gi,
                           m.giprofile, gi_ids(gp));
        for (unsigned j = 0; j < g->ngis; j++) {
            const struct nvmlGpuInstance_st *o = &g->decl_gis[j];
            if (start < o->start + o->size && o->start < start + gp->eighths)
                return fail_at(ps, "mig %llu: gi %u and gi %u overlap in memory", idx, m.gi, o->id);
        }
        if (same == gp->instances)
            return fail_at(ps, "mig %llu: more than %u GPU instances of giprofile %u", idx, gp->instances, m.giprofile);
        struct nvmlGpuInstance_st *gi = &g->decl_gis[g->ngis++];
        gi->used = 1;
        gi->gpu = g->index;
        gi->id = m.gi;
        gi->profile_id = gp->id;
        gi->giprofile = m.giprofile;
        gi->slices = m.slices;
        gi->start = start;
        gi->size = gp->eighths;
        gi->memory = m.memory;
    }
    m.used = 1;
    g->decl_migs[g->nmig++] = m;
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
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient Resources";
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
    for (unsigned k = 0; k < MAX_MIG; k++) {
        if (ci == NO_INSTANCE && g->gis[k].used && g->gis[k].id == gi)
            return 1;
        if (ci != NO_INSTANCE && g->migs[k].used && g->migs[k].gi == gi && g->migs[k].ci == ci)
            return 1;
    }
    return 0;
}

/* parse_procs reads "<pid>[:<MiB>][,...]" into list; -1 when malformed, too long, or a pid repeats. */
static int parse_procs(const char *val, struct proc *list, unsigned *count)
{
    char buf[LINE_LEN];
    snprintf(buf, sizeof buf, "%s", val);
    *count = 0;
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        unsigned long long pid, mib = 0;
        char *colon = strchr(item, ':');
        if (colon)
            *colon = '\0';
        if (*count == MAX_PROCS || parse_uint(item, 10, 0xFFFFFFFFULL, &pid) || pid == 0 ||
            (colon && parse_uint(colon + 1, 10, 1ULL << 40, &mib)))
            return -1;
        for (unsigned k = 0; k < *count; k++)
            if (list[k].pid == pid)
                return -1;
        list[*count].pid = (unsigned)pid;
        list[*count].memory = mib << 20;
        (*count)++;
    }
    return *count == 0 ? -1 : 0;
}

/* apply runs one control command; it fills err and returns -1 when the command is wrong. */
static int apply(char **tok, int n, char *err, size_t errlen)
{
    const char *cmd = tok[0];
    mig_sync(); /* xid names instances another process may have created */
    if (!strcmp(cmd, "fail") || !strcmp(cmd, "unfail")) {
        if (n != 1) {
            snprintf(err, errlen, "usage: %s", cmd);
            return -1;
        }
        failing = !strcmp(cmd, "fail");
        return 0;
    }
    if (!strcmp(cmd, "unprivileged") || !strcmp(cmd, "privileged")) {
        if (n != 1) {
            snprintf(err, errlen, "usage: %s", cmd);
            return -1;
        }
        unprivileged = !strcmp(cmd, "unprivileged");
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
        {"mig-create-pause", 0, 1, "mig-create-pause <index> [before|after]"},
        {"mig-create-resume", 0, 0, "mig-create-resume <index>"},
        {"mig-create-wait", 0, 1, "mig-create-wait <index> [<milliseconds>]"},
        {"mig-create-fail", 0, 1, "mig-create-fail <index> [any|gi|ci]"},
        {"procs", 0, 1, "procs <index> [<pid>[:<MiB>][,<pid>[:<MiB>]...]]"},
        {"graphics-procs", 0, 1, "graphics-procs <index> [<pid>[:<MiB>][,<pid>[:<MiB>]...]]"},
        {"persistence", 1, 1, "persistence <index> on|off"},
        {"resetfail", 0, 1, "resetfail <index> [any|remove|discover]"},
        {"comebackbroken", 0, 1, "comebackbroken <index> [reset|reboot|drain|drain-and-reset]"},
        {"reset-pause", 0, 1, "reset-pause <index> [remove|discover]"},
        {"reset-resume", 0, 0, "reset-resume <index>"},
        {"reset-wait", 0, 1, "reset-wait <index> [<milliseconds>]"},
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
        snprintf(err, errlen, "unknown command %s (want xid, ecc, temp, throttle, lost, recover, recovery, remap, transient, "
                              "mig-create-pause, mig-create-resume, mig-create-wait, mig-create-fail, procs, graphics-procs, "
                              "persistence, resetfail, comebackbroken, reset-pause, reset-resume, reset-wait, fail, unfail, "
                              "unprivileged or privileged)", cmd);
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
    if (!strncmp(cmd, "mig-create-", 11) && (!(g->has & HAS_MIG) || !g->mig)) {
        snprintf(err, errlen, "%s: gpu %llu does not have MIG on", cmd, idx);
        return -1;
    }
    if (!strcmp(cmd, "mig-create-pause")) {
        if (n == 3 && strcmp(tok[2], "before") != 0 && strcmp(tok[2], "after") != 0) {
            snprintf(err, errlen, "usage: %s", usage);
            return -1;
        }
        g->mig_pause = n == 3 && !strcmp(tok[2], "after") ? MIG_PAUSE_AFTER : MIG_PAUSE_BEFORE;
        return 0;
    }
    if (!strcmp(cmd, "mig-create-resume")) {
        g->mig_pause = MIG_PAUSE_NONE;
        g->mig_resumes++;
        pthread_cond_broadcast(&mig_cond);
        return 0;
    }
    if (!strcmp(cmd, "mig-create-fail")) {
        static const char *const kinds[] = {"any", "gi", "ci"};
        unsigned k = 0;
        while (n == 3 && k < 3 && strcmp(kinds[k], tok[2]) != 0)
            k++;
        if (k == 3) {
            snprintf(err, errlen, "usage: %s", usage);
            return -1;
        }
        g->mig_fail = MIG_FAIL_ANY + k; /* the order of MIG_FAIL_* */
        return 0;
    }
    if (!strcmp(cmd, "mig-create-wait") || !strcmp(cmd, "reset-wait")) {
        /* Answers once a creation (a removal or rediscovery) on the GPU is paused; the control thread waits meanwhile. */
        int mig = !strcmp(cmd, "mig-create-wait");
        const unsigned *paused = mig ? &g->mig_paused : &g->reset_paused;
        if (n == 3 && (parse_uint(tok[2], 10, 3600000, &v) || v == 0)) {
            snprintf(err, errlen, "usage: %s", usage);
            return -1;
        }
        unsigned long long ms = n == 3 ? v : 10000;
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_sec += (time_t)(ms / 1000);
        deadline.tv_nsec += (long)(ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
        while (*paused == 0 && !control_stopping)
            if (pthread_cond_timedwait(&mig_cond, &mu, &deadline) == ETIMEDOUT)
                break;
        if (*paused == 0) {
            snprintf(err, errlen, "%s: no %s on gpu %llu paused within %llu ms", cmd,
                     mig ? "compute instance creation" : "removal or rediscovery", idx, ms);
            return -1;
        }
        return 0;
    }
    if (!strcmp(cmd, "reset-pause")) {
        if (n == 3 && strcmp(tok[2], "remove") != 0 && strcmp(tok[2], "discover") != 0) {
            snprintf(err, errlen, "usage: %s", usage);
            return -1;
        }
        g->reset_pause = n == 3 && !strcmp(tok[2], "discover") ? RESET_PAUSE_DISCOVER : RESET_PAUSE_REMOVE;
        return 0;
    }
    if (!strcmp(cmd, "reset-resume")) {
        g->reset_pause = RESET_PAUSE_NONE;
        g->reset_resumes++;
        pthread_cond_broadcast(&mig_cond);
        return 0;
    }
    if (!strcmp(cmd, "procs") || !strcmp(cmd, "graphics-procs")) {
        struct proc list[MAX_PROCS] = {{0, 0}};
        unsigned count = 0;
        if (n == 3 && parse_procs(tok[2], list, &count) != 0) {
            snprintf(err, errlen, "%s: %s is not a list of <pid>[:<MiB>] (at most %d, pids from 1, no repeats)", cmd, tok[2],
                     MAX_PROCS);
            return -1;
        }
        unsigned kind = !strcmp(cmd, "procs") ? PROCS_COMPUTE : PROCS_GRAPHICS;
        memcpy(g->procs[kind], list, sizeof list);
        g->nprocs[kind] = count;
        return 0;
    }
    if (!strcmp(cmd, "persistence")) {
        if (strcmp(tok[2], "on") != 0 && strcmp(tok[2], "off") != 0) {
            snprintf(err, errlen, "usage: %s", usage);
            return -1;
        }
        g->persistence = !strcmp(tok[2], "on");
        return 0;
    }
    if (!strcmp(cmd, "resetfail")) {
        static const char *const steps[] = {"any", "remove", "discover"};
        unsigned k = 0;
        while (n == 3 && k < 3 && strcmp(steps[k], tok[2]) != 0)
            k++;
        if (k == 3) {
            snprintf(err, errlen, "usage: %s", usage);
            return -1;
        }
        g->reset_fail = RESET_FAIL_ANY + k; /* the order of RESET_FAIL_* */
        return 0;
    }
    if (!strcmp(cmd, "comebackbroken")) {
        static const char *const actions[] = {"none", "reset", "reboot", "drain", "drain-and-reset"};
        unsigned a = 1;
        while (n == 3 && a < sizeof actions / sizeof actions[0] && strcmp(actions[a], tok[2]) != 0)
            a++;
        if (a == sizeof actions / sizeof actions[0]) {
            snprintf(err, errlen, "usage: %s", usage);
            return -1;
        }
        g->comeback_broken = 1;
        g->comeback_action = a; /* the order of nvmlDeviceGpuRecoveryAction_t */
        return 0;
    }
    if (g->removed && (!strcmp(cmd, "xid") || !strcmp(cmd, "ecc") || !strcmp(cmd, "lost") || !strcmp(cmd, "recovery")))
        log_line("%s: gpu %llu is removed (nvmlDeviceRemoveGpu): no event set holds it, so no event is delivered", cmd,
                 idx);
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
        g->mig_pause = MIG_PAUSE_NONE;
        g->mig_fail = MIG_FAIL_NONE;
        g->reset_fail = RESET_FAIL_NONE;
        g->comeback_broken = 0;
        g->reset_pause = RESET_PAUSE_NONE;
        g->mig_resumes++;   /* a paused creation goes on */
        g->reset_resumes++; /* and a paused removal or rediscovery */
        pthread_cond_broadcast(&mig_cond);
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
    pthread_mutex_lock(&mu);
    control_stopping = 0;
    pthread_mutex_unlock(&mu);
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
    pthread_mutex_lock(&mu);
    control_stopping = 1; /* ends a mig-create-wait */
    pthread_cond_broadcast(&mig_cond);
    pthread_mutex_unlock(&mu);
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
    const char *statepath = getenv("MOCK_NVML_MIG_STATE");
    const char *procpath = getenv("MOCK_NVML_PROC_ROOT");
    const char *drainpath = getenv("MOCK_NVML_DRAIN_STATE");

    pthread_mutex_lock(&mu);
    prof = *p;
    failing = 0;
    unprivileged = 0;
    for (unsigned i = 0; i < prof.ngpus; i++) {
        memset(prof.gpus[i].gis, 0, sizeof prof.gpus[i].gis);
        set_declared(&prof.gpus[i]);
    }
    snprintf(state_path, sizeof state_path, "%s", statepath ? statepath : "");
    snprintf(proc_root, sizeof proc_root, "%s", procpath ? procpath : "");
    snprintf(drain_path, sizeof drain_path, "%s", drainpath ? drainpath : "");
    if (logpath && *logpath && !log_file) {
        log_file = fopen(logpath, "ae");
        if (!log_file)
            fprintf(stderr, "mocknvml: opening MOCK_NVML_LOG %s: %s\n", logpath, strerror(errno));
    }
    if (state_reload(1, err, sizeof err) != 0) {
        fprintf(stderr, "mocknvml: MOCK_NVML_MIG_STATE: %s\n", err);
        log_line("nvmlInit: MOCK_NVML_MIG_STATE: %s", err);
        pthread_mutex_unlock(&mu);
        free(p);
        pthread_mutex_unlock(&lifecycle);
        return NVML_ERROR_UNKNOWN;
    }
    if (drain_load(err, sizeof err) != 0) {
        fprintf(stderr, "mocknvml: MOCK_NVML_DRAIN_STATE: %s\n", err);
        log_line("nvmlInit: MOCK_NVML_DRAIN_STATE: %s", err);
        pthread_mutex_unlock(&mu);
        free(p);
        pthread_mutex_unlock(&lifecycle);
        return NVML_ERROR_UNKNOWN;
    }
    log_line("nvmlInit: profile %s, %u GPUs%s%s", path, prof.ngpus, state_path[0] ? ", MIG state " : "", state_path);
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
    pthread_cond_broadcast(&mig_cond); /* and paused creations */
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
 * for some k < slots that live(GPU, k) accepts, and sets *k; NULL when p is
 * no such pointer. It is how a handle is told apart from anything else: GPU
 * handles are &prof.gpus[i] (first 0, size the whole struct), MIG device and
 * GPU instance handles point into a live slot of a GPU's migs and gis
 * arrays (a destroyed instance's handle no longer does).
 */
static struct nvmlDevice_st *member_of(const void *p, size_t first, size_t size, unsigned slots,
                                       int (*live)(const struct nvmlDevice_st *, unsigned), unsigned *k)
{
    uintptr_t base = (uintptr_t)prof.gpus, a = (uintptr_t)p;
    if (a < base || a - base >= prof.ngpus * sizeof prof.gpus[0])
        return NULL;
    struct nvmlDevice_st *g = &prof.gpus[(a - base) / sizeof prof.gpus[0]];
    size_t off = (a - base) % sizeof prof.gpus[0];
    if (off < first || (off - first) % size != 0 || (off - first) / size >= slots || !live(g, (unsigned)((off - first) / size)))
        return NULL;
    *k = (unsigned)((off - first) / size);
    return g;
}

static int whole(const struct nvmlDevice_st *g, unsigned k) { (void)g; return k == 0; }
static int mig_live(const struct nvmlDevice_st *g, unsigned k) { return g->migs[k].used; }
static int gi_live(const struct nvmlDevice_st *g, unsigned k) { return g->gis[k].used; }

/* mig_of and gi_slot resolve a MIG device (or compute instance) and a GPU instance handle; NULL if none lives there. */
static struct nvmlDevice_st *mig_of(const void *h, unsigned *k)
{
    return member_of(h, offsetof(struct nvmlDevice_st, migs), sizeof prof.gpus[0].migs[0], MAX_MIG, mig_live, k);
}

static struct nvmlDevice_st *gi_slot(const void *h, unsigned *k)
{
    return member_of(h, offsetof(struct nvmlDevice_st, gis), sizeof prof.gpus[0].gis[0], MAX_MIG, gi_live, k);
}

/* mig_handle is the nvmlDevice_t of a MIG device: it points at the mig_dev, never dereferenced as a GPU. */
static struct nvmlDevice_st *mig_handle(struct mig_dev *m) { return (struct nvmlDevice_st *)(void *)m; }

/*
 * gpu_state answers for the GPU a call reaches, MIG handles included: fail,
 * lost, transient. A handle held across nvmlDeviceRemoveGpu answers
 * GPU_IS_LOST until the GPU is rediscovered.
 */
static nvmlReturn_t gpu_state(struct nvmlDevice_st *g)
{
    if (failing)
        return NVML_ERROR_UNKNOWN;
    if (g->removed || g->lost)
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
    mig_sync(); /* another process may have created or destroyed instances */
    unsigned k;
    struct nvmlDevice_st *g = member_of(h, 0, sizeof *h, 1, whole, &k);
    *mig = NULL;
    if (!g) {
        g = mig_of(h, &k);
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
    for (unsigned i = 0; ret == NVML_SUCCESS && i < prof.ngpus; i++)
        *deviceCount -= (unsigned)prof.gpus[i].removed;
    pthread_mutex_unlock(&mu);
    return ret;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { return count(deviceCount); }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) { return count(deviceCount); }

/* handle_by returns the handle of the GPU match picks; lookups obey fail and lost, and never find a removed GPU. */
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
            if (!prof.gpus[i].removed && match(&prof.gpus[i], key)) {
                ret = device_check(&prof.gpus[i]);
                if (ret == NVML_SUCCESS)
                    device->handle = &prof.gpus[i];
                break;
            }
    }
    pthread_mutex_unlock(&mu);
    return ret;
}

/*
 * nvml_index is a GPU's index as NVML enumerates it now: its place among the
 * GPUs not removed, so removing GPU 1 of four makes the others 0 to 2
 * ("the new enumeration will be 0-2", nvml.h on nvmlDeviceRemoveGpu). The
 * profile's index (g->index) never changes; control commands take it.
 */
static unsigned nvml_index(const struct nvmlDevice_st *g)
{
    unsigned n = 0;
    for (unsigned i = 0; i < g->index; i++)
        n += !prof.gpus[i].removed;
    return n;
}

static int match_index(const struct nvmlDevice_st *g, const void *key) { return nvml_index(g) == *(const unsigned *)key; }
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
    else
        mig_sync();
    for (unsigned i = 0; refcount > 0 && i < prof.ngpus; i++)
        for (unsigned k = 0; k < MAX_MIG; k++)
            if (!prof.gpus[i].removed && prof.gpus[i].migs[k].used && !strcmp(prof.gpus[i].migs[k].uuid, uuid)) {
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
    DEVICE_QUERY(device, index, *index = nvml_index(g));
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

/*
 * What the driver holds. A GPU starts with the instances its profile
 * declares. Instances can be created and destroyed; with
 * MOCK_NVML_MIG_STATE the instances of every GPU a create or destroy
 * touched are kept in that file, written under a lock at each change and
 * read again by every process when it changes, so all of them see one
 * driver, as processes on a node do, and a process killed and started again
 * finds what it created. README.md describes the file.
 */

/* Profile memory in MiB: its eighths of the GPU's (an eighth per slice without a memory key). */
static unsigned long long gi_profile_mib(const struct nvmlDevice_st *g, const struct gi_profile *p)
{
    return (g->has & HAS_MEMORY) ? (g->memory >> 20) * p->eighths / 8 : 1024ULL * p->eighths;
}

/* gi_profile_name is the profile's name on g, as nvidia-smi prints it: "3g.40gb", "1g.10gb+me". */
static void gi_profile_name(const struct nvmlDevice_st *g, const struct gi_profile *p, char *buf, size_t len)
{
    snprintf(buf, len, "%ug.%llugb%s", p->slices, (gi_profile_mib(g, p) + 1023) / 1024, p->suffix);
}

/* The compute slices of compute instance profile (its ID, which is its index); 0 for one no A100 or H100 offers. */
static unsigned ci_slices_of(unsigned profile)
{
    static const unsigned slices[] = {
        [NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE] = 1, [NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE] = 2,
        [NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE] = 3, [NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE] = 4,
        [NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE] = 7,
    };
    return profile < sizeof slices / sizeof slices[0] ? slices[profile] : 0;
}

/*
 * Whether a GPU instance of s slices offers compute instances of c, as an
 * A100 or H100 does: the whole instance, 1c and 2c in any larger one, 3c
 * and 4c in the 7-slice one.
 */
static int ci_offered(unsigned c, unsigned s)
{
    return c != 0 && (c == s || (c <= 2 && c < s) || (c <= 4 && s == MIG_SLICES));
}

/* ci_placements are the compute slices a compute instance of c may start at in s: multiples of c it fits from. */
static unsigned ci_placements(unsigned c, unsigned s)
{
    unsigned mask = 0;
    for (unsigned start = 0; start + c <= s; start += c)
        mask |= 1u << start;
    return mask;
}

/* ci_sms: a whole GPU instance has its profile's SMs; a smaller compute instance those of the GPU instance profile of its slices. */
static unsigned ci_sms(const struct gi_profile *p, unsigned c)
{
    if (c == p->slices)
        return p->sms;
    for (size_t k = 0; k < N_GI_PROFILES; k++)
        if (gi_profiles[k].slices == c && gi_profiles[k].eighths <= 4)
            return gi_profiles[k].sms;
    return 16 * c;
}

static struct nvmlGpuInstance_st *gi_find(struct nvmlDevice_st *g, unsigned id)
{
    for (unsigned k = 0; k < MAX_MIG; k++)
        if (g->gis[k].used && g->gis[k].id == id)
            return &g->gis[k];
    return NULL;
}

/* gi_fits says whether a GPU instance of p fits at start beside g's: INSUFFICIENT_RESOURCES if not. */
static nvmlReturn_t gi_fits(const struct nvmlDevice_st *g, const struct gi_profile *p, unsigned start)
{
    unsigned memory = 0, slices = p->slices, same = 0;
    for (unsigned k = 0; k < MAX_MIG; k++) {
        const struct nvmlGpuInstance_st *o = &g->gis[k];
        if (!o->used)
            continue;
        memory |= ((1u << o->size) - 1) << o->start;
        slices += o->slices;
        same += o->profile_id == p->id;
    }
    if (same >= p->instances || slices > MIG_SLICES || (memory & ((1u << p->eighths) - 1) << start))
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    return NVML_SUCCESS;
}

/* ci_used is the mask of compute slices the compute instances of GPU instance gi take. */
static unsigned ci_used(const struct nvmlDevice_st *g, unsigned gi)
{
    unsigned mask = 0;
    for (unsigned k = 0; k < MAX_MIG; k++)
        if (g->migs[k].used && g->migs[k].gi == gi)
            mask |= ((1u << g->migs[k].cislices) - 1) << g->migs[k].ci_start;
    return mask;
}

/* ci_free are the placements for a compute instance of c in gi that no compute instance takes. */
static unsigned ci_free(const struct nvmlDevice_st *g, const struct nvmlGpuInstance_st *gi, unsigned c)
{
    unsigned used = ci_used(g, gi->id), mask = 0, all = ci_placements(c, gi->slices);
    for (unsigned s = 0; s < MIG_SLICES; s++)
        if ((all >> s & 1) && !(used & ((1u << c) - 1) << s))
            mask |= 1u << s;
    return mask;
}

/* set_instances makes g hold gis (any order) and migs (by MIG device index), keeping the slot of every GPU instance that stays. */
static void set_instances(struct nvmlDevice_st *g, const struct nvmlGpuInstance_st *gis, const struct mig_dev *migs)
{
    struct nvmlGpuInstance_st next[MAX_MIG];
    int placed[MAX_MIG] = {0};
    memset(next, 0, sizeof next);
    for (unsigned k = 0; k < MAX_MIG; k++)
        for (unsigned j = 0; g->gis[k].used && j < MAX_MIG; j++)
            if (gis[j].used && !placed[j] && gis[j].id == g->gis[k].id && gis[j].profile_id == g->gis[k].profile_id) {
                next[k] = gis[j];
                placed[j] = 1;
                break;
            }
    for (unsigned j = 0; j < MAX_MIG; j++) {
        unsigned k = 0;
        while (gis[j].used && !placed[j] && next[k].used)
            k++; /* GPU instances take a slice each, so there is a free slot */
        if (gis[j].used && !placed[j])
            next[k] = gis[j];
    }
    for (unsigned k = 0; k < MAX_MIG; k++)
        next[k].gpu = g->index;
    memcpy(g->gis, next, sizeof next);
    memcpy(g->migs, migs, sizeof g->migs);
}

/* set_declared gives g its profile's instances back. */
static void set_declared(struct nvmlDevice_st *g)
{
    set_instances(g, g->decl_gis, g->decl_migs);
    g->in_state = 0;
}

/* mig_uuid derives a new MIG device's UUID from its parent, instance ids and creation count, shaped as the driver's (version 5). */
static void mig_uuid(const struct nvmlDevice_st *g, unsigned gi, unsigned ci, unsigned long long counter, char *out,
                     size_t len)
{
    char key[STR_LEN + 64];
    snprintf(key, sizeof key, "%s/%u/%u/%llu", g->uuid, gi, ci, counter);
    unsigned long long h[2] = {0xcbf29ce484222325ULL, 0x84222325cbf29ce4ULL}; /* FNV-1a, two seeds */
    for (int i = 0; i < 2; i++)
        for (const char *c = key; *c; c++)
            h[i] = (h[i] ^ (unsigned char)*c) * 0x100000001b3ULL;
    snprintf(out, len, "MIG-%08llx-%04llx-5%03llx-%04llx-%012llx", h[0] >> 32, (h[0] >> 16) & 0xffff,
             h[0] & 0xfff, 0x8000 | ((h[1] >> 48) & 0x3fff), h[1] & 0xffffffffffffULL);
}

/* ------------------------------------------------------ capability files */

/* mkdirs makes path's directories down to the last '/' of it. */
static int mkdirs(char *path)
{
    for (char *p = strchr(path + 1, '/'); p; p = strchr(p + 1, '/')) {
        *p = '\0';
        int rc = mkdir(path, 0755);
        *p = '/';
        if (rc != 0 && errno != EEXIST)
            return -1;
    }
    return 0;
}

/* cap_dir is the procfs directory of GPU instance gi, or of its compute instance ci. */
static void cap_dir(const struct nvmlDevice_st *g, unsigned gi, unsigned ci, char *buf, size_t len)
{
    if (ci == NO_INSTANCE)
        snprintf(buf, len, "%s/driver/nvidia/capabilities/gpu%u/mig/gi%u", proc_root, g->minor, gi);
    else
        snprintf(buf, len, "%s/driver/nvidia/capabilities/gpu%u/mig/gi%u/ci%u", proc_root, g->minor, gi, ci);
}

/*
 * cap_add writes the access capability of a new GPU instance (ci
 * NO_INSTANCE) or compute instance under MOCK_NVML_PROC_ROOT, as the driver
 * shows it, with the minor its mig-minors table gives it: 3 + 135 * GPU
 * minor + 9 * gi for the GPU instance, that + 1 + ci for a compute instance.
 */
static void cap_add(const struct nvmlDevice_st *g, unsigned gi, unsigned ci)
{
    if (!proc_root[0])
        return;
    char path[4200];
    cap_dir(g, gi, ci, path, sizeof path);
    size_t n = strlen(path);
    snprintf(path + n, sizeof path - n, "/access");
    unsigned minor = 3 + g->minor * (MAX_GI_ID + 1) * (MAX_CI_ID + 2) + gi * (MAX_CI_ID + 2);
    if (ci != NO_INSTANCE)
        minor += 1 + ci;
    FILE *f = NULL;
    if (mkdirs(path) == 0)
        f = fopen(path, "we");
    if (!f || fprintf(f, "DeviceFileMinor: %u\nDeviceFileMode: 444\n", minor) < 0 || fclose(f) != 0)
        log_line("writing capability %s: %s", path, strerror(errno));
}

/* cap_remove takes a destroyed instance's capability away. */
static void cap_remove(const struct nvmlDevice_st *g, unsigned gi, unsigned ci)
{
    if (!proc_root[0])
        return;
    char dir[4200], path[4300];
    cap_dir(g, gi, ci, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/access", dir);
    if ((unlink(path) != 0 && errno != ENOENT) || (rmdir(dir) != 0 && errno != ENOENT))
        log_line("removing capability %s: %s", dir, strerror(errno));
}

/* -------------------------------------------------------------- state file */

struct state_gpu {
    int named;
    struct nvmlGpuInstance_st gis[MAX_MIG]; /* the first ngi */
    unsigned ngi;
    struct mig_dev migs[MAX_MIG]; /* by MIG device index */
};

struct state_file {
    unsigned long long counter;
    struct state_gpu gpus[MAX_GPUS];
};

static int state_fail(char *err, size_t len, int line, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int state_fail(char *err, size_t len, int line, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(err, len, "%.300s:%d: %s", state_path, line, msg);
    return -1;
}

/* state_keys finds the values of keys in key=value words; unknown keys are left for newer writers. */
static int state_keys(char **tok, int n, const char *const *keys, const char **vals, size_t nkeys)
{
    for (size_t k = 0; k < nkeys; k++)
        vals[k] = NULL;
    for (int i = 1; i < n; i++) {
        char *eq = strchr(tok[i], '=');
        if (!eq)
            return -1;
        *eq = '\0';
        for (size_t k = 0; k < nkeys; k++)
            if (!strcmp(tok[i], keys[k]))
                vals[k] = eq + 1;
    }
    return 0;
}

static int state_uint(const char *s, unsigned max, unsigned *out)
{
    unsigned long long v;
    if (!s || parse_uint(s, 10, max, &v))
        return -1;
    *out = (unsigned)v;
    return 0;
}

/* state_gi reads "gi id= profile= start= size= [memory=]" into the GPU, checking it fits beside the ones above. */
static int state_gi(struct state_gpu *sg, const struct nvmlDevice_st *g, char **tok, int n, int line, char *err,
                    size_t len)
{
    static const char *const keys[] = {"id", "profile", "start", "size", "memory"};
    const char *v[5];
    unsigned id, pid, start, size, mib = 0;
    const struct gi_profile *p;
    if (state_keys(tok, n, keys, v, 5) || state_uint(v[0], MAX_GI_ID, &id) || state_uint(v[1], 1000, &pid) ||
        state_uint(v[2], MEM_SLICES - 1, &start) || state_uint(v[3], MEM_SLICES, &size) ||
        (v[4] && state_uint(v[4], 1u << 30, &mib)))
        return state_fail(err, len, line, "usage: gi id=<0-14> profile=<ID> start=<0-7> size=<1-8> [memory=<MiB>]");
    if (!(p = gi_profile_by_id(pid)))
        return state_fail(err, len, line, "gi %u: profile %u is not a GPU instance profile ID the mock offers", id, pid);
    if (!(p->placements >> start & 1) || size != p->eighths || gi_id_at(p, start) != id)
        return state_fail(err, len, line, "gi %u: profile %u has no GPU instance %u at %u:%u", id, pid, id, start, size);
    struct nvmlGpuInstance_st gi = {1, g->index, id, p->id, p->index, p->slices, start, size,
                                    (mib ? mib : gi_profile_mib(g, p)) << 20};
    unsigned slices = p->slices, same = 0;
    for (unsigned k = 0; k < sg->ngi; k++) {
        const struct nvmlGpuInstance_st *o = &sg->gis[k];
        if (o->id == id || (start < o->start + o->size && o->start < start + size))
            return state_fail(err, len, line, "gi %u: overlaps gi %u", id, o->id);
        slices += o->slices;
        same += o->profile_id == pid;
    }
    if (slices > MIG_SLICES || same >= p->instances)
        return state_fail(err, len, line, "gi %u: more GPU instances than the GPU holds", id);
    sg->gis[sg->ngi++] = gi;
    return 0;
}

/* state_ci reads "ci gi= id= profile= start= size= index= uuid= [sms=] [name=]" into the GPU. */
static int state_ci(struct state_gpu *sg, const struct nvmlDevice_st *g, char **tok, int n, int line, char *err,
                    size_t len)
{
    static const char *const keys[] = {"gi", "id", "profile", "start", "size", "index", "uuid", "sms", "name"};
    const char *v[9];
    unsigned gid, id, pid, start, size, index, sms = 0;
    if (state_keys(tok, n, keys, v, 9) || state_uint(v[0], MAX_GI_ID, &gid) || state_uint(v[1], MAX_CI_ID, &id) ||
        state_uint(v[2], NVML_COMPUTE_INSTANCE_PROFILE_COUNT - 1, &pid) || state_uint(v[3], MIG_SLICES - 1, &start) ||
        state_uint(v[4], MIG_SLICES, &size) || state_uint(v[5], MAX_MIG - 1, &index) || !v[6] ||
        strncmp(v[6], "MIG-", 4) != 0 || strlen(v[6]) >= 80 || (v[7] && state_uint(v[7], 65535, &sms)) ||
        (v[8] && (!*v[8] || strlen(v[8]) >= sizeof sg->migs[0].profile)))
        return state_fail(err, len, line,
                          "usage: ci gi=<id> id=<0-7> profile=<ID> start= size= index=<0-6> uuid=MIG-... [sms=] [name=]");
    const struct nvmlGpuInstance_st *gi = NULL;
    for (unsigned k = 0; k < sg->ngi; k++)
        if (sg->gis[k].id == gid)
            gi = &sg->gis[k];
    if (!gi)
        return state_fail(err, len, line, "ci %u/%u: no gi %u above it", gid, id, gid);
    unsigned c = ci_slices_of(pid), mask = ((1u << size) - 1) << start;
    if (!ci_offered(c, gi->slices) || size != c || start + size > gi->slices)
        return state_fail(err, len, line, "ci %u/%u: gi %u has no compute instance of profile %u at %u:%u", gid, id, gid,
                          pid, start, size);
    if (sg->migs[index].used)
        return state_fail(err, len, line, "ci %u/%u: index %u is also ci %u/%u's", gid, id, index,
                          sg->migs[index].gi, sg->migs[index].ci);
    for (unsigned k = 0; k < MAX_MIG; k++) {
        const struct mig_dev *o = &sg->migs[k];
        if (o->used && o->gi == gid && (o->ci == id || (mask & ((1u << o->cislices) - 1) << o->ci_start)))
            return state_fail(err, len, line, "ci %u/%u: overlaps ci %u/%u", gid, id, o->gi, o->ci);
    }
    const struct gi_profile *p = gi_profile(gi->giprofile);
    struct mig_dev *m = &sg->migs[index];
    memset(m, 0, sizeof *m);
    *m = (struct mig_dev){.used = 1, .gi = gid, .ci = id, .giprofile = gi->giprofile, .slices = gi->slices,
                          .cislices = c, .sms = sms ? sms : ci_sms(p, c), .ci_profile = pid, .ci_start = start,
                          .memory = gi->memory};
    snprintf(m->uuid, sizeof m->uuid, "%s", v[6]);
    if (v[8]) {
        snprintf(m->profile, sizeof m->profile, "%s", v[8]);
    } else {
        char name[24];
        gi_profile_name(g, p, name, sizeof name);
        if (c == gi->slices)
            snprintf(m->profile, sizeof m->profile, "%s", name);
        else
            snprintf(m->profile, sizeof m->profile, "%uc.%s", c, name);
    }
    return 0;
}

/* state_parse reads the state file into sf; on error it fills err with path:line: message. */
static int state_parse(FILE *f, struct state_file *sf, char *err, size_t len)
{
    char buf[LINE_LEN];
    char *tok[MAX_TOKENS];
    int line = 0, version = 0;
    struct state_gpu *sg = NULL;
    const struct nvmlDevice_st *g = NULL;
    while (fgets(buf, sizeof buf, f)) {
        line++;
        int n = tokenize(buf, tok, MAX_TOKENS);
        if (n < 0)
            return state_fail(err, len, line, "unterminated quote or more than %d words", MAX_TOKENS);
        if (n == 0)
            continue;
        if (!version && strcmp(tok[0], "version") != 0)
            return state_fail(err, len, line, "the file must start with version 1");
        if (!strcmp(tok[0], "version")) {
            if (n != 2 || strcmp(tok[1], "1") != 0)
                return state_fail(err, len, line, "version %s: this library reads version 1", n > 1 ? tok[1] : "");
            version = 1;
        } else if (!strcmp(tok[0], "counter")) {
            unsigned long long v;
            if (n != 2 || parse_uint(tok[1], 10, ~0ULL, &v))
                return state_fail(err, len, line, "usage: counter <creations>");
            sf->counter = v;
        } else if (!strcmp(tok[0], "gpu")) {
            static const char *const keys[] = {"uuid"};
            const char *v[1];
            if (state_keys(tok, n, keys, v, 1) || !v[0])
                return state_fail(err, len, line, "usage: gpu uuid=GPU-...");
            unsigned i = 0;
            while (i < prof.ngpus && strcmp(prof.gpus[i].uuid, v[0]) != 0)
                i++;
            if (i == prof.ngpus)
                return state_fail(err, len, line, "gpu %s is not in the profile", v[0]);
            g = &prof.gpus[i];
            sg = &sf->gpus[i];
            if (sg->named)
                return state_fail(err, len, line, "gpu %s is named twice", v[0]);
            if (!(g->has & HAS_MIG) || !g->mig)
                return state_fail(err, len, line, "gpu %s does not have MIG on", v[0]);
            sg->named = 1;
        } else if (!strcmp(tok[0], "gi") || !strcmp(tok[0], "ci")) {
            if (!sg)
                return state_fail(err, len, line, "%s before any gpu line", tok[0]);
            if ((tok[0][0] == 'g' ? state_gi : state_ci)(sg, g, tok, n, line, err, len))
                return -1;
        } else {
            return state_fail(err, len, line, "unknown keyword %s (want version, counter, gpu, gi or ci)", tok[0]);
        }
    }
    if (ferror(f))
        return state_fail(err, len, line, "reading: %s", strerror(errno));
    return 0;
}

static int same_file(const struct file_id *a, const struct file_id *b)
{
    return a->exists == b->exists && (!a->exists || (a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
                                                     a->mtime.tv_sec == b->mtime.tv_sec &&
                                                     a->mtime.tv_nsec == b->mtime.tv_nsec));
}

static struct file_id file_id_of(const struct stat *st)
{
    return (struct file_id){1, st->st_dev, st->st_ino, st->st_size, st->st_mtim};
}

/*
 * state_reload reads the state file when it changed since the last read (or
 * always, with force) and makes every GPU hold what it says: the instances
 * it lists for the GPUs it names, the profile's for the others (a missing
 * file names none). Call with mu held. On error the instances stay as they
 * were and err says why; the file is not read again until it changes.
 */
static int state_reload(int force, char *err, size_t len)
{
    if (!state_path[0])
        return 0;
    struct stat st;
    struct file_id id = {0};
    if (stat(state_path, &st) == 0)
        id = file_id_of(&st);
    if (!force && same_file(&id, &state_seen))
        return 0;
    FILE *f = fopen(state_path, "re");
    if (!f && errno != ENOENT) {
        snprintf(err, len, "opening %.300s: %s", state_path, strerror(errno));
        return -1;
    }
    id = (struct file_id){0};
    if (f && fstat(fileno(f), &st) == 0)
        id = file_id_of(&st);
    struct state_file *sf = calloc(1, sizeof *sf);
    int rc = 0;
    if (!sf) {
        snprintf(err, len, "reading %.300s: out of memory", state_path);
        rc = -1;
    } else if (f) {
        rc = state_parse(f, sf, err, len);
    }
    if (f)
        fclose(f);
    state_seen = id;
    if (rc == 0) {
        for (unsigned i = 0; i < prof.ngpus; i++) {
            struct nvmlDevice_st *g = &prof.gpus[i];
            if (!sf->gpus[i].named) {
                set_declared(g);
                continue;
            }
            struct nvmlGpuInstance_st gis[MAX_MIG];
            memset(gis, 0, sizeof gis);
            memcpy(gis, sf->gpus[i].gis, sf->gpus[i].ngi * sizeof gis[0]);
            set_instances(g, gis, sf->gpus[i].migs);
            g->in_state = 1;
        }
        if (sf->counter > mig_counter)
            mig_counter = sf->counter;
    }
    free(sf);
    return rc;
}

/* mig_sync reads the state file again if another process changed it; call with mu held. */
static void mig_sync(void)
{
    char err[600];
    if (state_reload(0, err, sizeof err) != 0) {
        log_line("MOCK_NVML_MIG_STATE: %s; keeping the instances read before", err);
        fprintf(stderr, "mocknvml: MOCK_NVML_MIG_STATE: %s; keeping the instances read before\n", err);
    }
}

/* state_write replaces the state file with the instances of every GPU it holds, atomically. */
static int state_write(char *err, size_t len)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp%d", state_path, (int)getpid());
    FILE *f = fopen(tmp, "we");
    if (!f) {
        snprintf(err, len, "writing %.300s: %s", tmp, strerror(errno));
        return -1;
    }
    fprintf(f, "# MIG instances of a mock NVML node (MOCK_NVML_MIG_STATE), kept by the library:\n"
               "# every process using the mock reads it, and rewrites it at each create and destroy.\n"
               "version 1\ncounter %llu\n",
            mig_counter);
    for (unsigned i = 0; i < prof.ngpus; i++) {
        const struct nvmlDevice_st *g = &prof.gpus[i];
        if (!g->in_state)
            continue;
        fprintf(f, "gpu uuid=%s index=%u\n", g->uuid, g->index);
        for (unsigned id = 0; id <= MAX_GI_ID; id++)
            for (unsigned k = 0; k < MAX_MIG; k++)
                if (g->gis[k].used && g->gis[k].id == id)
                    fprintf(f, "gi id=%u profile=%u start=%u size=%u memory=%llu\n", id, g->gis[k].profile_id,
                            g->gis[k].start, g->gis[k].size, g->gis[k].memory >> 20);
        for (unsigned k = 0; k < MAX_MIG; k++) {
            const struct mig_dev *m = &g->migs[k];
            if (m->used)
                fprintf(f, "ci gi=%u id=%u profile=%u start=%u size=%u index=%u sms=%u name=\"%s\" uuid=%s\n", m->gi,
                        m->ci, m->ci_profile, m->ci_start, m->cislices, k, m->sms, m->profile, m->uuid);
        }
    }
    int bad = fflush(f) != 0 || ferror(f);
    if (fclose(f) != 0 || bad || rename(tmp, state_path) != 0) {
        snprintf(err, len, "writing %.300s: %s", state_path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    struct stat st;
    if (stat(state_path, &st) == 0)
        state_seen = file_id_of(&st);
    return 0;
}

/*
 * mig_begin starts a create or destroy; call with mu held. With a state
 * file it takes the file's lock (so two processes change it in turn) and
 * reads it afresh; *lock is the lock's descriptor, -1 without a file.
 */
static nvmlReturn_t mig_begin(int *lock)
{
    *lock = -1;
    if (!state_path[0])
        return NVML_SUCCESS;
    char path[4200], err[600];
    snprintf(path, sizeof path, "%s.lock", state_path);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        log_line("MOCK_NVML_MIG_STATE: opening %s: %s", path, strerror(errno));
        return NVML_ERROR_UNKNOWN;
    }
    while (flock(fd, LOCK_EX) != 0)
        if (errno != EINTR) {
            log_line("MOCK_NVML_MIG_STATE: locking %s: %s", path, strerror(errno));
            close(fd);
            return NVML_ERROR_UNKNOWN;
        }
    if (state_reload(1, err, sizeof err) != 0) {
        log_line("MOCK_NVML_MIG_STATE: %s", err);
        close(fd);
        return NVML_ERROR_UNKNOWN;
    }
    *lock = fd;
    return NVML_SUCCESS;
}

/*
 * mig_end finishes what mig_begin started: when changed names the GPU whose
 * instances changed, the state file is written with it; a failed write
 * reads the file back, undoing the change, and answers UNKNOWN.
 */
static nvmlReturn_t mig_end(int lock, struct nvmlDevice_st *changed)
{
    nvmlReturn_t ret = NVML_SUCCESS;
    char err[600];
    if (lock >= 0 && changed) {
        int was = changed->in_state;
        changed->in_state = 1;
        if (state_write(err, sizeof err) != 0) {
            log_line("MOCK_NVML_MIG_STATE: %s; the change is undone", err);
            changed->in_state = was;
            if (state_reload(1, err, sizeof err) != 0)
                log_line("MOCK_NVML_MIG_STATE: %s", err);
            ret = NVML_ERROR_UNKNOWN;
        }
    }
    if (lock >= 0)
        close(lock); /* releases the lock */
    return ret;
}

/* mig_take_fail consumes an injected mig-create-fail for a creation of kind on g. */
static int mig_take_fail(struct nvmlDevice_st *g, unsigned kind, const char *call)
{
    if (g->mig_fail != MIG_FAIL_ANY && g->mig_fail != kind)
        return 0;
    g->mig_fail = MIG_FAIL_NONE;
    log_line("%s: gpu %u: failing as injected (mig-create-fail)", call, g->index);
    return 1;
}

/*
 * mig_stop holds a compute instance creation on g until mig-create-resume
 * (or recover) names the GPU, releasing mu meanwhile; call with mu held.
 * UNINITIALIZED when nvmlShutdown came first (g is then not touched again).
 */
static nvmlReturn_t mig_stop(struct nvmlDevice_st *g, const char *call, const char *where)
{
    unsigned long gen = generation, resumes = g->mig_resumes;
    g->mig_pause = MIG_PAUSE_NONE;
    g->mig_paused++;
    log_line("%s: gpu %u: paused %s (mig-create-pause), waiting for mig-create-resume %u", call, g->index, where,
             g->index);
    pthread_cond_broadcast(&mig_cond);
    while (generation == gen && g->mig_resumes == resumes)
        pthread_cond_wait(&mig_cond, &mu);
    if (generation != gen)
        return NVML_ERROR_UNINITIALIZED;
    g->mig_paused--;
    log_line("%s: gpu %u: resumed", call, g->index);
    return NVML_SUCCESS;
}

/* --------------------------------------------------------- MIG devices */

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

/* A MIG device's index is its slot: the profile's in line order, a created one the lowest free. */
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice)
{
    DEVICE_QUERY(device, migDevice, {
        if (!(g->has & HAS_MIG))
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        else if (index >= (g->mig ? MAX_MIG : 0))
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        else if (!g->migs[index].used)
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

/* ------------------------------------------------------- GPU instances */

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gpuInstance)
{
    DEVICE_QUERY(device, gpuInstance, {
        struct nvmlGpuInstance_st *gi = NULL;
        if (!(g->has & HAS_MIG) || !g->mig)
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        else if (!(gi = gi_find(g, id)))
            ret_ = NVML_ERROR_NOT_FOUND;
        else
            gpuInstance->handle = gi;
    });
}

/* gi_of resolves a GPU instance handle to its GPU and instance; call with mu held. */
static nvmlReturn_t gi_of(nvmlGpuInstance_t gpuInstance, struct nvmlDevice_st **gpu, struct nvmlGpuInstance_st **gi)
{
    if (refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    mig_sync();
    unsigned k;
    struct nvmlDevice_st *g = gi_slot(gpuInstance.handle, &k);
    if (!g)
        return NVML_ERROR_INVALID_ARGUMENT; /* never one, or destroyed */
    *gpu = g;
    *gi = &g->gis[k];
    return gpu_state(g);
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info)
{
    pthread_mutex_lock(&mu);
    struct nvmlDevice_st *g;
    struct nvmlGpuInstance_st *gi;
    nvmlReturn_t ret = gi_of(gpuInstance, &g, &gi);
    if (ret == NVML_SUCCESS && !info)
        ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) {
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

/*
 * The placements of a profile, by its ID, whether MIG is on or not (as
 * nvml.h says); NOT_SUPPORTED on a GPU that cannot do MIG or for an ID it
 * does not offer. A NULL placements asks for the count; a count too small
 * for them is INSUFFICIENT_SIZE, with the count needed.
 */
static nvmlReturn_t possible_placements(nvmlDevice_t device, unsigned int profileId,
                                        nvmlGpuInstancePlacement_t *placements, unsigned int *count)
{
    DEVICE_QUERY(device, count, {
        const struct gi_profile *p = gi_profile_by_id(profileId);
        if (!(g->has & HAS_MIG) || !p) {
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        } else {
            unsigned n = 0;
            for (unsigned s = 0; s < MEM_SLICES; s++)
                if (p->placements >> s & 1) {
                    if (placements && n < *count)
                        placements[n] = (nvmlGpuInstancePlacement_t){s, p->eighths};
                    n++;
                }
            if (placements && *count < n)
                ret_ = NVML_ERROR_INSUFFICIENT_SIZE;
            *count = n;
        }
    });
}

nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int profileId,
                                                           nvmlGpuInstancePlacement_t *placements,
                                                           unsigned int *count)
{
    return possible_placements(device, profileId, placements, count);
}

/* v1 has the same struct; go-nvml falls back to it only without v2. */
nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements(nvmlDevice_t device, unsigned int profileId,
                                                        nvmlGpuInstancePlacement_t *placements, unsigned int *count)
{
    return possible_placements(device, profileId, placements, count);
}

/* How many more instances of the profile fit: free placements, slices and the profile's instance count allowing. */
nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device, unsigned int profileId,
                                                       unsigned int *count)
{
    DEVICE_QUERY(device, count, {
        const struct gi_profile *p = gi_profile_by_id(profileId);
        if (!(g->has & HAS_MIG) || !g->mig || !p) {
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        } else {
            /* A profile's placements do not overlap each other, so each free one can hold an instance. */
            unsigned n = 0, used = 0, same = 0;
            for (unsigned s = 0; s < MEM_SLICES; s++) {
                unsigned memory = 0;
                for (unsigned k = 0; k < MAX_MIG; k++)
                    if (g->gis[k].used)
                        memory |= ((1u << g->gis[k].size) - 1) << g->gis[k].start;
                if ((p->placements >> s & 1) && !(memory & ((1u << p->eighths) - 1) << s))
                    n++;
            }
            for (unsigned k = 0; k < MAX_MIG; k++)
                if (g->gis[k].used) {
                    used += g->gis[k].slices;
                    same += g->gis[k].profile_id == p->id;
                }
            if (n > (MIG_SLICES - used) / p->slices)
                n = (MIG_SLICES - used) / p->slices;
            if (n > p->instances - same)
                n = p->instances - same;
            *count = n;
        }
    });
}

/*
 * create_gi makes a GPU instance of the profile with that ID at placement,
 * or at the first free one without. Its id follows the placement (gi_id_at).
 */
static nvmlReturn_t create_gi(nvmlDevice_t device, unsigned int profileId, const nvmlGpuInstancePlacement_t *placement,
                              nvmlGpuInstance_t *gpuInstance, const char *call)
{
    pthread_mutex_lock(&mu);
    if (refcount == 0)
        return device_end(NVML_ERROR_UNINITIALIZED);
    int lock;
    nvmlReturn_t ret = mig_begin(&lock);
    if (ret != NVML_SUCCESS)
        return device_end(ret);
    struct nvmlDevice_st *g = device.handle;
    const struct gi_profile *p = NULL;
    unsigned start = 0;
    ret = device_check(device.handle);
    if (ret != NVML_SUCCESS) {
        mig_end(lock, NULL);
        return device_end(ret);
    }
    if (!(g->has & HAS_MIG) || !g->mig)
        ret = NVML_ERROR_NOT_SUPPORTED;
    else if (!gpuInstance || !(p = gi_profile_by_id(profileId)))
        ret = NVML_ERROR_INVALID_ARGUMENT;
    else if (placement && (placement->start >= MEM_SLICES || !(p->placements >> placement->start & 1) ||
                           placement->size != p->eighths))
        ret = NVML_ERROR_INVALID_ARGUMENT; /* not one of the profile's placements */
    else if (mig_take_fail(g, MIG_FAIL_GI, call))
        ret = NVML_ERROR_INSUFFICIENT_RESOURCES;
    else if (placement)
        ret = gi_fits(g, p, start = placement->start);
    else
        for (ret = NVML_ERROR_INSUFFICIENT_RESOURCES, start = 0; ret != NVML_SUCCESS && start < MEM_SLICES; start++)
            if ((p->placements >> start & 1) && gi_fits(g, p, start) == NVML_SUCCESS) {
                ret = NVML_SUCCESS;
                break;
            }
    struct nvmlGpuInstance_st *gi = NULL;
    if (ret == NVML_SUCCESS) {
        for (unsigned k = 0; !gi && k < MAX_MIG; k++)
            if (!g->gis[k].used)
                gi = &g->gis[k]; /* fits means at most 7 instances, so one is free */
        *gi = (struct nvmlGpuInstance_st){1, g->index, gi_id_at(p, start), p->id, p->index, p->slices, start,
                                          p->eighths, gi_profile_mib(g, p) << 20};
    }
    nvmlReturn_t wrote = mig_end(lock, ret == NVML_SUCCESS ? g : NULL);
    if (ret == NVML_SUCCESS)
        ret = wrote;
    if (ret == NVML_SUCCESS) {
        cap_add(g, gi->id, NO_INSTANCE);
        gpuInstance->handle = gi;
        log_line("%s: gpu %u profile %u: created gpu instance %u at %u:%u", call, g->index, profileId, gi->id,
                 gi->start, gi->size);
    } else if (placement) {
        log_line("%s: gpu %u profile %u at %u:%u: %s", call, g->index, profileId, placement->start, placement->size,
                 nvmlErrorString(ret));
    } else {
        log_line("%s: gpu %u profile %u: %s", call, g->index, profileId, nvmlErrorString(ret));
    }
    return device_end(ret);
}

nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profileId, nvmlGpuInstance_t *gpuInstance)
{
    return create_gi(device, profileId, NULL, gpuInstance, "nvmlDeviceCreateGpuInstance");
}

nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profileId,
                                                      const nvmlGpuInstancePlacement_t *placement,
                                                      nvmlGpuInstance_t *gpuInstance)
{
    if (!placement)
        return NVML_ERROR_INVALID_ARGUMENT;
    return create_gi(device, profileId, placement, gpuInstance, "nvmlDeviceCreateGpuInstanceWithPlacement");
}

/* The GPU instances of a profile, by its ID, in id order. */
nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId, nvmlGpuInstance_t *gpuInstances,
                                       unsigned int *count)
{
    DEVICE_QUERY(device, gpuInstances && count, {
        if (!(g->has & HAS_MIG) || !g->mig) {
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        } else if (!gi_profile_by_id(profileId)) {
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            /* At most the profile's instance count, the buffer go-nvml passes. */
            unsigned n = 0;
            for (unsigned id = 0; id <= MAX_GI_ID; id++) {
                struct nvmlGpuInstance_st *gi = gi_find(g, id);
                if (gi && gi->profile_id == profileId)
                    gpuInstances[n++].handle = gi;
            }
            *count = n;
        }
    });
}

/* Destroying a GPU instance that holds compute instances is IN_USE, as NVML answers. */
nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance)
{
    pthread_mutex_lock(&mu);
    if (refcount == 0)
        return device_end(NVML_ERROR_UNINITIALIZED);
    int lock;
    nvmlReturn_t ret = mig_begin(&lock);
    if (ret != NVML_SUCCESS)
        return device_end(ret);
    struct nvmlDevice_st *g;
    struct nvmlGpuInstance_st *gi;
    ret = gi_of(gpuInstance, &g, &gi);
    if (ret != NVML_SUCCESS) {
        mig_end(lock, NULL);
        log_line("nvmlGpuInstanceDestroy: %s", nvmlErrorString(ret));
        return device_end(ret);
    }
    unsigned id = gi->id;
    if (ci_used(g, id))
        ret = NVML_ERROR_IN_USE;
    else
        memset(gi, 0, sizeof *gi);
    nvmlReturn_t wrote = mig_end(lock, ret == NVML_SUCCESS ? g : NULL);
    if (ret == NVML_SUCCESS)
        ret = wrote;
    if (ret == NVML_SUCCESS) {
        cap_remove(g, id, NO_INSTANCE);
        log_line("nvmlGpuInstanceDestroy: gpu %u: destroyed gpu instance %u", g->index, id);
    } else {
        log_line("nvmlGpuInstanceDestroy: gpu %u gpu instance %u: %s", g->index, id, nvmlErrorString(ret));
    }
    return device_end(ret);
}

/* ------------------------------------------------------- compute instances */

/*
 * A MIG device is one compute instance of a GPU instance. Compute instance
 * handles point at the mig_dev (as MIG device handles do, under another
 * type); compute instance profile IDs are the profile indices
 * (NVML_COMPUTE_INSTANCE_PROFILE_*), as nvidia-smi mig -lcip shows them.
 */

/* ci_profile_check: INVALID_ARGUMENT past the indices nvml.h knows, NOT_SUPPORTED for one gi does not offer; else its slices. */
static nvmlReturn_t ci_profile_check(const struct nvmlGpuInstance_st *gi, unsigned profile, unsigned *c)
{
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    *c = ci_slices_of(profile);
    return ci_offered(*c, gi->slices) ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

/*
 * Compute instance profile info within a GPU instance, by profile ID (which
 * is the index): slices and instance count; SM and engine counts read 0, as
 * the GPU instance profiles' do. INVALID_ARGUMENT for an engine profile
 * other than SHARED.
 */
nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                          unsigned int engProfile,
                                                          nvmlComputeInstanceProfileInfo_t *info)
{
    pthread_mutex_lock(&mu);
    struct nvmlDevice_st *g;
    struct nvmlGpuInstance_st *gi;
    unsigned c = 0;
    nvmlReturn_t ret = gi_of(gpuInstance, &g, &gi);
    if (ret == NVML_SUCCESS && (!info || engProfile >= NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT))
        ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS)
        ret = ci_profile_check(gi, profile, &c);
    if (ret == NVML_SUCCESS) {
        memset(info, 0, sizeof *info);
        info->id = profile;
        info->sliceCount = c;
        info->instanceCount = gi->slices / c;
    }
    return device_end(ret);
}

#ifndef MOCK_R470
/* The versioned call (R510): v2 and v3 add a name (left empty here) and capabilities. */
nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                           unsigned int engProfile,
                                                           nvmlComputeInstanceProfileInfo_v2_t *info)
{
    pthread_mutex_lock(&mu);
    struct nvmlDevice_st *g;
    struct nvmlGpuInstance_st *gi;
    unsigned c = 0;
    nvmlReturn_t ret = gi_of(gpuInstance, &g, &gi);
    if (ret == NVML_SUCCESS && (!info || engProfile >= NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT))
        ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS && info->version != nvmlComputeInstanceProfileInfo_v2 &&
        info->version != nvmlComputeInstanceProfileInfo_v3)
        ret = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (ret == NVML_SUCCESS)
        ret = ci_profile_check(gi, profile, &c);
    if (ret == NVML_SUCCESS) {
        unsigned version = info->version;
        if (version == nvmlComputeInstanceProfileInfo_v3)
            memset(info, 0, sizeof(nvmlComputeInstanceProfileInfo_v3_t));
        else
            memset(info, 0, sizeof *info);
        info->version = version;
        info->id = profile;
        info->sliceCount = c;
        info->instanceCount = gi->slices / c;
    }
    return device_end(ret);
}
#endif

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
    for (unsigned k = 0; k < MAX_MIG; k++)
        if (g->migs[k].used && g->migs[k].gi == gi->id && g->migs[k].ci == id) {
            computeInstance->handle = (struct nvmlComputeInstance_st *)(void *)&g->migs[k];
            return device_end(NVML_SUCCESS);
        }
    return device_end(NVML_ERROR_NOT_FOUND);
}

/* The compute instances of a profile in a GPU instance, in id order. */
nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                nvmlComputeInstance_t *computeInstances, unsigned int *count)
{
    pthread_mutex_lock(&mu);
    struct nvmlDevice_st *g;
    struct nvmlGpuInstance_st *gi;
    unsigned c;
    nvmlReturn_t ret = gi_of(gpuInstance, &g, &gi);
    if (ret == NVML_SUCCESS && (!computeInstances || !count))
        ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS)
        ret = ci_profile_check(gi, profileId, &c);
    if (ret == NVML_SUCCESS) {
        unsigned n = 0;
        for (unsigned id = 0; id <= MAX_CI_ID; id++)
            for (unsigned k = 0; k < MAX_MIG; k++)
                if (g->migs[k].used && g->migs[k].gi == gi->id && g->migs[k].ci == id &&
                    g->migs[k].ci_profile == profileId)
                    computeInstances[n++].handle = (struct nvmlComputeInstance_st *)(void *)&g->migs[k];
        *count = n;
    }
    return device_end(ret);
}

/* How many more compute instances of the profile fit in the GPU instance. */
nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                                unsigned int *count)
{
    pthread_mutex_lock(&mu);
    struct nvmlDevice_st *g;
    struct nvmlGpuInstance_st *gi;
    unsigned c;
    nvmlReturn_t ret = gi_of(gpuInstance, &g, &gi);
    if (ret == NVML_SUCCESS && !count)
        ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS)
        ret = ci_profile_check(gi, profileId, &c);
    if (ret == NVML_SUCCESS)
        *count = (unsigned)__builtin_popcount(ci_free(g, gi, c)); /* placements of one profile do not overlap */
    return device_end(ret);
}

/* The placements of a compute instance profile in the GPU instance's compute slices; count as for GPU instances. */
nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                                 nvmlComputeInstancePlacement_t *placements,
                                                                 unsigned int *count)
{
    pthread_mutex_lock(&mu);
    struct nvmlDevice_st *g;
    struct nvmlGpuInstance_st *gi;
    unsigned c;
    nvmlReturn_t ret = gi_of(gpuInstance, &g, &gi);
    if (ret == NVML_SUCCESS && !count)
        ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS)
        ret = ci_profile_check(gi, profileId, &c);
    if (ret == NVML_SUCCESS) {
        unsigned n = 0, all = ci_placements(c, gi->slices);
        for (unsigned s = 0; s < MIG_SLICES; s++)
            if (all >> s & 1) {
                if (placements && n < *count)
                    placements[n] = (nvmlComputeInstancePlacement_t){s, c};
                n++;
            }
        if (placements && *count < n)
            ret = NVML_ERROR_INSUFFICIENT_SIZE;
        *count = n;
    }
    return device_end(ret);
}

/*
 * create_ci makes a compute instance of the profile in the GPU instance, at
 * placement or the first free one: the lowest free compute instance id
 * (the first is 0), the lowest free MIG device index, a new UUID. The
 * mig-create-pause and mig-create-fail faults act here.
 */
static nvmlReturn_t create_ci(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                              const nvmlComputeInstancePlacement_t *placement, nvmlComputeInstance_t *computeInstance,
                              const char *call)
{
    pthread_mutex_lock(&mu);
    struct nvmlDevice_st *g;
    struct nvmlGpuInstance_st *gi;
    unsigned c = 0;
    nvmlReturn_t ret = gi_of(gpuInstance, &g, &gi);
    if (ret == NVML_SUCCESS && !computeInstance)
        ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS)
        ret = ci_profile_check(gi, profileId, &c);
    if (ret == NVML_SUCCESS && placement &&
        (placement->start >= MIG_SLICES || !(ci_placements(c, gi->slices) >> placement->start & 1) ||
         placement->size != c))
        ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret != NVML_SUCCESS) {
        log_line("%s: %s", call, nvmlErrorString(ret));
        return device_end(ret);
    }
    unsigned gid = gi->id;
    if (g->mig_pause == MIG_PAUSE_BEFORE) { /* the GPU instance exists, the compute instance not yet */
        char where[64];
        snprintf(where, sizeof where, "before creating a compute instance in gpu instance %u", gid);
        if ((ret = mig_stop(g, call, where)) != NVML_SUCCESS)
            return device_end(ret);
    }
    int lock;
    if ((ret = mig_begin(&lock)) != NVML_SUCCESS)
        return device_end(ret);
    /* Read afresh: the GPU instance may be gone. */
    unsigned k;
    if (!(g = gi_slot(gpuInstance.handle, &k)) || g->gis[k].id != gid) {
        mig_end(lock, NULL);
        log_line("%s: gpu instance %u was destroyed", call, gid);
        return device_end(NVML_ERROR_INVALID_ARGUMENT);
    }
    gi = &g->gis[k];
    unsigned free_at = ci_free(g, gi, c), start = 0, id = 0, slot = 0;
    if (mig_take_fail(g, MIG_FAIL_CI, call))
        ret = NVML_ERROR_INSUFFICIENT_RESOURCES;
    else if (placement)
        ret = (free_at >> (start = placement->start) & 1) ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_RESOURCES;
    else if (free_at)
        start = (unsigned)__builtin_ctz(free_at);
    else
        ret = NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (ret == NVML_SUCCESS) {
        while (mig_instance(g, gid, id))
            id++; /* at most 7 compute instances, ids 0 to 7 */
        while (g->migs[slot].used)
            slot++; /* at most 7 compute slices in use, so a slot is free */
        const struct gi_profile *p = gi_profile(gi->giprofile);
        struct mig_dev *m = &g->migs[slot];
        memset(m, 0, sizeof *m);
        *m = (struct mig_dev){.used = 1, .gi = gid, .ci = id, .giprofile = gi->giprofile, .slices = gi->slices,
                              .cislices = c, .sms = ci_sms(p, c), .ci_profile = profileId, .ci_start = start,
                              .memory = gi->memory};
        char name[24];
        gi_profile_name(g, p, name, sizeof name);
        if (c == gi->slices)
            snprintf(m->profile, sizeof m->profile, "%s", name);
        else
            snprintf(m->profile, sizeof m->profile, "%uc.%s", c, name);
        mig_uuid(g, gid, id, ++mig_counter, m->uuid, sizeof m->uuid);
    }
    nvmlReturn_t wrote = mig_end(lock, ret == NVML_SUCCESS ? g : NULL);
    if (ret == NVML_SUCCESS)
        ret = wrote;
    if (ret != NVML_SUCCESS) {
        log_line("%s: gpu %u gpu instance %u profile %u: %s", call, g->index, gid, profileId, nvmlErrorString(ret));
        return device_end(ret);
    }
    cap_add(g, gid, id);
    computeInstance->handle = (struct nvmlComputeInstance_st *)(void *)&g->migs[slot];
    log_line("%s: gpu %u gpu instance %u profile %u: created compute instance %u at %u:%u, MIG device %u %s", call,
             g->index, gid, profileId, id, start, c, slot, g->migs[slot].uuid);
    if (g->mig_pause == MIG_PAUSE_AFTER) { /* both exist; the caller has not heard */
        char where[96];
        snprintf(where, sizeof where, "after creating compute instance %u in gpu instance %u", id, gid);
        ret = mig_stop(g, call, where);
    }
    return device_end(ret);
}

nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                  nvmlComputeInstance_t *computeInstance)
{
    return create_ci(gpuInstance, profileId, NULL, computeInstance, "nvmlGpuInstanceCreateComputeInstance");
}

nvmlReturn_t nvmlGpuInstanceCreateComputeInstanceWithPlacement(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                               const nvmlComputeInstancePlacement_t *placement,
                                                               nvmlComputeInstance_t *computeInstance)
{
    if (!placement)
        return NVML_ERROR_INVALID_ARGUMENT;
    return create_ci(gpuInstance, profileId, placement, computeInstance,
                     "nvmlGpuInstanceCreateComputeInstanceWithPlacement");
}

/* ci_of resolves a compute instance handle (a live MIG device slot); call with mu held. */
static nvmlReturn_t ci_of(nvmlComputeInstance_t computeInstance, struct nvmlDevice_st **gpu, unsigned *k)
{
    if (refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    mig_sync();
    struct nvmlDevice_st *g = mig_of(computeInstance.handle, k);
    if (!g)
        return NVML_ERROR_INVALID_ARGUMENT; /* never one, or destroyed */
    *gpu = g;
    return gpu_state(g);
}

nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance)
{
    pthread_mutex_lock(&mu);
    if (refcount == 0)
        return device_end(NVML_ERROR_UNINITIALIZED);
    int lock;
    nvmlReturn_t ret = mig_begin(&lock);
    if (ret != NVML_SUCCESS)
        return device_end(ret);
    struct nvmlDevice_st *g;
    unsigned k;
    ret = ci_of(computeInstance, &g, &k);
    if (ret != NVML_SUCCESS) {
        mig_end(lock, NULL);
        log_line("nvmlComputeInstanceDestroy: %s", nvmlErrorString(ret));
        return device_end(ret);
    }
    unsigned gid = g->migs[k].gi, id = g->migs[k].ci;
    memset(&g->migs[k], 0, sizeof g->migs[k]);
    ret = mig_end(lock, g);
    if (ret == NVML_SUCCESS) {
        cap_remove(g, gid, id);
        log_line("nvmlComputeInstanceDestroy: gpu %u: destroyed compute instance %u of gpu instance %u, MIG device %u",
                 g->index, id, gid, k);
    } else {
        log_line("nvmlComputeInstanceDestroy: gpu %u compute instance %u/%u: %s", g->index, gid, id,
                 nvmlErrorString(ret));
    }
    return device_end(ret);
}

/*
 * The compute instance's GPU, GPU instance, id, profile and placement in
 * its GPU instance's compute slices. Only the v2 call: v1's struct lacks
 * the placement.
 */
nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t *info)
{
    pthread_mutex_lock(&mu);
    struct nvmlDevice_st *g;
    unsigned k;
    nvmlReturn_t ret = ci_of(computeInstance, &g, &k);
    if (ret == NVML_SUCCESS && !info)
        ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret != NVML_SUCCESS)
        return device_end(ret);
    const struct mig_dev *m = &g->migs[k];
    memset(info, 0, sizeof *info);
    info->device.handle = g;
    info->gpuInstance.handle = gi_find(g, m->gi);
    info->id = m->ci;
    info->profileId = m->ci_profile;
    info->placement.start = m->ci_start;
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

#ifndef MOCK_R470
/*
 * Fabric info: NOT_SUPPORTED outside an NVLink domain (no fabric key), as
 * on every GPU but those of a multi-node NVLink system. The versioned call
 * takes v2 and v3 (v3 adds the health summary) and refuses other versions,
 * writing no further than the caller's version says its struct reaches.
 */
nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *gpuFabricInfo)
{
    DEVICE_QUERY(device, gpuFabricInfo, {
        if (!(g->has & HAS_FABRIC)) {
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        } else {
            memcpy(gpuFabricInfo->clusterUuid, g->fabric_uuid, sizeof gpuFabricInfo->clusterUuid);
            gpuFabricInfo->status = g->fabric_status;
            gpuFabricInfo->cliqueId = g->fabric_clique;
            gpuFabricInfo->state = (nvmlGpuFabricState_t)g->fabric_state;
        }
    });
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *gpuFabricInfo)
{
    DEVICE_QUERY(device, gpuFabricInfo, {
        unsigned version = gpuFabricInfo->version;
        if (version != nvmlGpuFabricInfo_v2 && version != nvmlGpuFabricInfo_v3) {
            ret_ = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        } else if (!(g->has & HAS_FABRIC)) {
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        } else {
            nvmlGpuFabricInfo_v2_t *v2 = (nvmlGpuFabricInfo_v2_t *)(void *)gpuFabricInfo;
            memcpy(v2->clusterUuid, g->fabric_uuid, sizeof v2->clusterUuid);
            v2->status = g->fabric_status;
            v2->cliqueId = g->fabric_clique;
            v2->state = (nvmlGpuFabricState_t)g->fabric_state;
            /* No degraded bandwidth, no route recovery, no unhealthy route. */
            v2->healthMask = NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE << NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW |
                             NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_RECOVERY_FALSE << NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY |
                             NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_FALSE << NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY;
            if (version == nvmlGpuFabricInfo_v3)
                gpuFabricInfo->healthSummary = NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY;
        }
    });
}
#endif

/* A vGPU guest's GPU says VGPU; a bare-metal one NONE. */
nvmlReturn_t nvmlDeviceGetVirtualizationMode(nvmlDevice_t device, nvmlGpuVirtualizationMode_t *mode)
{
    DEVICE_QUERY(device, mode, {
        *mode = (g->has & HAS_VGPU) ? NVML_GPU_VIRTUALIZATION_MODE_VGPU : NVML_GPU_VIRTUALIZATION_MODE_NONE;
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

/* -------------------------------------------------------------- processes */

/*
 * running lists the processes of a kind on a GPU (the procs and
 * graphics-procs commands), with nvml.h's count protocol: a *infoCount too
 * small (0 with infos NULL included) is INSUFFICIENT_SIZE with *infoCount
 * set to the number, or SUCCESS when there are none. Not on MIG devices,
 * nor a GPU whose profile says unsupported=procs.
 */
static nvmlReturn_t running(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos, unsigned kind)
{
    DEVICE_QUERY(device, infoCount, {
        unsigned n = g->nprocs[kind];
        if (g->unsupported & UNSUP_PROCS) {
            ret_ = NVML_ERROR_NOT_SUPPORTED;
        } else if (*infoCount < n) {
            *infoCount = n;
            ret_ = NVML_ERROR_INSUFFICIENT_SIZE;
        } else if (n > 0 && !infos) {
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            for (unsigned k = 0; k < n; k++)
                infos[k] = (nvmlProcessInfo_t){.pid = g->procs[kind][k].pid,
                                               .usedGpuMemory = g->procs[kind][k].memory,
                                               .gpuInstanceId = NO_INSTANCE,
                                               .computeInstanceId = NO_INSTANCE};
            *infoCount = n;
        }
    });
}

/* v2 (R450+) and v3 (R510+) take the same struct; go-nvml calls the newest exported, R470 has v2. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos)
{
    return running(device, infoCount, infos, PROCS_COMPUTE);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos)
{
    return running(device, infoCount, infos, PROCS_GRAPHICS);
}

#ifndef MOCK_R470
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos)
{
    return running(device, infoCount, infos, PROCS_COMPUTE);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos)
{
    return running(device, infoCount, infos, PROCS_GRAPHICS);
}
#endif

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    DEVICE_QUERY(device, mode, *mode = g->persistence ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED);
}

/* ------------------------------------------------------------ drain states */

/*
 * Drain, removal and rediscovery, as nvml.h's "Drain states" chapter says:
 * a GPU is named by its PCI address (the domain, bus and device fields of
 * nvmlPciInfo_t); persistence mode counts as an attachment (IN_USE); the
 * calls that change anything need root (the unprivileged command answers
 * NO_PERMISSION in its place); a GPU whose profile says unsupported=drain
 * answers NOT_SUPPORTED, as a vGPU guest does. nvmlDeviceRemoveGpu answers
 * IN_USE while a process runs on the GPU, and here also while it is not
 * draining (nvml.h returns a refused GPU "to its original draining state",
 * so a removal starts from one). A removed GPU leaves the enumeration (the
 * others' indices close up), handle lookups do not find it, its handles
 * answer GPU_IS_LOST and its event registrations are dropped.
 * nvmlDeviceDiscoverGpus brings it back initialised, as a reset leaves a
 * GPU: the same UUID and handle, drain off, no process, no MIG instance
 * (MIG mode kept), compute mode default, and the faults recover clears gone;
 * comebackbroken then sets a recovery action again.
 */

/*
 * The driver keeps drain states and removals when the process that made
 * them ends. With MOCK_NVML_DRAIN_STATE set, every change is written to
 * that file (a new file renamed over it), one line a GPU that is not as a
 * fresh driver holds it: "draining <uuid>" or "removed <uuid>" (removed
 * implies draining). nvmlInit reads it, so a process started after one
 * that was killed mid-reset finds the GPU as the killed one left it.
 */
static void drain_save(void)
{
    if (!drain_path[0])
        return;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", drain_path, (int)getpid());
    FILE *f = fopen(tmp, "we");
    if (!f) {
        log_line("MOCK_NVML_DRAIN_STATE: %s: %s", tmp, strerror(errno));
        return;
    }
    fprintf(f, "# mocknvml: drain states and removals, as the driver keeps them\n");
    for (unsigned i = 0; i < prof.ngpus; i++) {
        const struct nvmlDevice_st *g = &prof.gpus[i];
        if (g->removed || g->draining)
            fprintf(f, "%s %s\n", g->removed ? "removed" : "draining", g->uuid);
    }
    if (fclose(f) != 0 || rename(tmp, drain_path) != 0) {
        log_line("MOCK_NVML_DRAIN_STATE: writing %s: %s", drain_path, strerror(errno));
        unlink(tmp);
    }
}

/* drain_load reads MOCK_NVML_DRAIN_STATE at nvmlInit (a missing file: none); call with mu held. */
static int drain_load(char *err, size_t len)
{
    if (!drain_path[0])
        return 0;
    FILE *f = fopen(drain_path, "re");
    if (!f) {
        if (errno == ENOENT)
            return 0;
        snprintf(err, len, "%s", strerror(errno));
        return -1;
    }
    char line[512];
    int lineno = 0, bad = 0;
    while (!bad && fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = 0;
        char word[32], uuid[STR_LEN], extra[8];
        int got = sscanf(line, "%31s %95s %7s", word, uuid, extra);
        if (got <= 0)
            continue;
        struct nvmlDevice_st *g = NULL;
        for (unsigned i = 0; got == 2 && i < prof.ngpus; i++)
            if (!strcmp(prof.gpus[i].uuid, uuid))
                g = &prof.gpus[i];
        if (got != 2 || (strcmp(word, "draining") != 0 && strcmp(word, "removed") != 0) || !g) {
            snprintf(err, len, "line %d: want \"draining <uuid>\" or \"removed <uuid>\" of a GPU of the profile", lineno);
            bad = 1;
            break;
        }
        g->draining = 1;
        g->removed = !strcmp(word, "removed");
        log_line("nvmlInit: gpu %u: %s, as an earlier process left it (MOCK_NVML_DRAIN_STATE)", g->index, word);
    }
    fclose(f);
    return bad ? -1 : 0;
}

/*
 * reset_stop holds a removal or rediscovery of g until reset-resume (or
 * recover) names the GPU, releasing mu meanwhile; call with mu held.
 * UNINITIALIZED when nvmlShutdown came first.
 */
static nvmlReturn_t reset_stop(struct nvmlDevice_st *g, const char *call, const char *where)
{
    unsigned long gen = generation, resumes = g->reset_resumes;
    g->reset_pause = RESET_PAUSE_NONE;
    g->reset_paused++;
    log_line("%s: gpu %u: paused %s (reset-pause), waiting for reset-resume %u", call, g->index, where, g->index);
    pthread_cond_broadcast(&mig_cond);
    while (generation == gen && g->reset_resumes == resumes)
        pthread_cond_wait(&mig_cond, &mu);
    if (generation != gen)
        return NVML_ERROR_UNINITIALIZED;
    g->reset_paused--;
    log_line("%s: gpu %u: resumed", call, g->index);
    return NVML_SUCCESS;
}

/* gpu_at_pci is the GPU at the PCI address in p (removed ones too); NULL if none. */
static struct nvmlDevice_st *gpu_at_pci(const nvmlPciInfo_t *p)
{
    for (unsigned i = 0; i < prof.ngpus; i++) {
        const struct pci *a = &prof.gpus[i].pci;
        if (a->domain == p->domain && a->bus == p->bus && a->dev == p->device)
            return &prof.gpus[i];
    }
    return NULL;
}

/*
 * drain_begin locks mu and finds the GPU a drain-state call names: not
 * removed, answering, supporting drain states and, when admin, called by
 * root. On success the caller must device_end.
 */
static nvmlReturn_t drain_begin(const nvmlPciInfo_t *pciInfo, int admin, struct nvmlDevice_st **gpu)
{
    pthread_mutex_lock(&mu);
    if (refcount == 0)
        return device_end(NVML_ERROR_UNINITIALIZED);
    struct nvmlDevice_st *g = pciInfo ? gpu_at_pci(pciInfo) : NULL;
    if (!g || g->removed)
        return device_end(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t ret = gpu_state(g);
    if (ret == NVML_SUCCESS && (g->unsupported & UNSUP_DRAIN))
        ret = NVML_ERROR_NOT_SUPPORTED;
    else if (ret == NVML_SUCCESS && admin && unprivileged)
        ret = NVML_ERROR_NO_PERMISSION;
    if (ret != NVML_SUCCESS)
        return device_end(ret);
    *gpu = g;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceModifyDrainState(nvmlPciInfo_t *pciInfo, nvmlEnableState_t newState)
{
    if (newState != NVML_FEATURE_DISABLED && newState != NVML_FEATURE_ENABLED)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct nvmlDevice_st *g;
    nvmlReturn_t ret = drain_begin(pciInfo, 1, &g);
    if (ret != NVML_SUCCESS)
        return ret;
    if (g->persistence) {
        log_line("nvmlDeviceModifyDrainState: gpu %u: persistence mode is on: IN_USE", g->index);
        return device_end(NVML_ERROR_IN_USE);
    }
    g->draining = newState == NVML_FEATURE_ENABLED;
    log_line("nvmlDeviceModifyDrainState: gpu %u: drain state %s", g->index, g->draining ? "on" : "off");
    drain_save();
    return device_end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceQueryDrainState(nvmlPciInfo_t *pciInfo, nvmlEnableState_t *currentState)
{
    if (!currentState)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct nvmlDevice_st *g;
    nvmlReturn_t ret = drain_begin(pciInfo, 0, &g);
    if (ret != NVML_SUCCESS)
        return ret;
    *currentState = g->draining ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return device_end(NVML_SUCCESS);
}

/* take_reset_fail consumes an injected resetfail for step on g. */
static int take_reset_fail(struct nvmlDevice_st *g, unsigned step, const char *call)
{
    if (g->reset_fail != RESET_FAIL_ANY && g->reset_fail != step)
        return 0;
    g->reset_fail = RESET_FAIL_NONE;
    log_line("%s: gpu %u: failing as injected (resetfail)", call, g->index);
    return 1;
}

static nvmlReturn_t remove_gpu(nvmlPciInfo_t *pciInfo, const char *call)
{
    struct nvmlDevice_st *g;
    nvmlReturn_t ret = drain_begin(pciInfo, 1, &g);
    if (ret != NVML_SUCCESS)
        return ret;
    if (g->reset_pause == RESET_PAUSE_REMOVE) { /* draining, not removed yet */
        if ((ret = reset_stop(g, call, "before removing it")) != NVML_SUCCESS)
            return device_end(ret);
        if (g->removed) /* another caller removed it meanwhile */
            return device_end(NVML_ERROR_INVALID_ARGUMENT);
        if ((ret = gpu_state(g)) != NVML_SUCCESS)
            return device_end(ret);
    }
    const char *why = NULL;
    if (g->persistence)
        why = "persistence mode is on";
    else if (g->nprocs[PROCS_COMPUTE] + g->nprocs[PROCS_GRAPHICS] > 0)
        why = "processes are attached";
    else if (!g->draining)
        why = "it is not draining (nvmlDeviceModifyDrainState first)";
    if (why) {
        log_line("%s: gpu %u: %s: IN_USE", call, g->index, why);
        return device_end(NVML_ERROR_IN_USE);
    }
    if (take_reset_fail(g, RESET_FAIL_REMOVE, call))
        return device_end(NVML_ERROR_UNKNOWN);
    g->removed = 1;
    for (struct nvmlEventSet_st *s = sets; s; s = s->next)
        s->mask[g->index] = 0;
    log_line("%s: gpu %u: removed", call, g->index);
    drain_save();
    return device_end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceRemoveGpu_v2(nvmlPciInfo_t *pciInfo, nvmlDetachGpuState_t gpuState, nvmlPcieLinkState_t linkState)
{
    if ((gpuState != NVML_DETACH_GPU_KEEP && gpuState != NVML_DETACH_GPU_REMOVE) ||
        (linkState != NVML_PCIE_LINK_KEEP && linkState != NVML_PCIE_LINK_SHUT_DOWN))
        return NVML_ERROR_INVALID_ARGUMENT;
    return remove_gpu(pciInfo, "nvmlDeviceRemoveGpu_v2");
}

/* The R384-era call, still exported by current drivers: as _v2 with the GPU and its link kept. */
nvmlReturn_t nvmlDeviceRemoveGpu(nvmlPciInfo_t *pciInfo)
{
    return remove_gpu(pciInfo, "nvmlDeviceRemoveGpu");
}

/* mig_clear destroys every MIG instance of g, as a reset does (MIG mode stays); call with mu held. */
static void mig_clear(struct nvmlDevice_st *g)
{
    int lock;
    if (mig_begin(&lock) != NVML_SUCCESS) {
        log_line("nvmlDeviceDiscoverGpus: gpu %u: MIG state not cleared", g->index);
        return;
    }
    int had = 0;
    for (unsigned k = 0; k < MAX_MIG; k++) {
        if (g->migs[k].used) {
            cap_remove(g, g->migs[k].gi, g->migs[k].ci);
            had = 1;
        }
    }
    for (unsigned k = 0; k < MAX_MIG; k++) {
        if (g->gis[k].used) {
            cap_remove(g, g->gis[k].id, NO_INSTANCE);
            had = 1;
        }
    }
    memset(g->migs, 0, sizeof g->migs);
    memset(g->gis, 0, sizeof g->gis);
    mig_end(lock, had || g->in_state ? g : NULL);
}

nvmlReturn_t nvmlDeviceDiscoverGpus(nvmlPciInfo_t *pciInfo)
{
    if (!pciInfo)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mu);
    if (refcount == 0)
        return device_end(NVML_ERROR_UNINITIALIZED);
    if (failing)
        return device_end(NVML_ERROR_UNKNOWN);
    if (unprivileged)
        return device_end(NVML_ERROR_NO_PERMISSION);
    /* Only the domain, bus and device fields narrow the search; all zero searches everything (nvml.h). */
    int all = pciInfo->domain == 0 && pciInfo->bus == 0 && pciInfo->device == 0;
    nvmlReturn_t ret = NVML_SUCCESS;
    for (unsigned i = 0; i < prof.ngpus; i++) {
        struct nvmlDevice_st *g = &prof.gpus[i];
        if (!g->removed || (!all && gpu_at_pci(pciInfo) != g))
            continue;
        if (g->reset_pause == RESET_PAUSE_DISCOVER) { /* removed, not back yet */
            nvmlReturn_t r = reset_stop(g, "nvmlDeviceDiscoverGpus", "before rediscovering it");
            if (r != NVML_SUCCESS)
                return device_end(r);
            if (!g->removed) /* another caller rediscovered it meanwhile */
                continue;
        }
        if (take_reset_fail(g, RESET_FAIL_DISCOVER, "nvmlDeviceDiscoverGpus")) {
            ret = NVML_ERROR_UNKNOWN; /* it stays removed */
            continue;
        }
        reset_faults(g);
        g->removed = 0;
        g->draining = 0;
        g->compute_mode = NVML_COMPUTEMODE_DEFAULT;
        memset(g->nprocs, 0, sizeof g->nprocs);
        mig_clear(g);
        if (g->comeback_broken) {
            g->recovery = g->comeback_action;
            g->comeback_broken = 0;
            log_line("nvmlDeviceDiscoverGpus: gpu %u: rediscovered broken (comebackbroken)", g->index);
        } else {
            log_line("nvmlDeviceDiscoverGpus: gpu %u: rediscovered", g->index);
        }
    }
    drain_save();
    return device_end(ret);
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
#endif
nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device) { return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) { return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) { return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) { return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType, nvmlEccCounterType_t counterType, unsigned long long *eccCounts) { return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending) { return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link, unsigned int *version) { return NVML_ERROR_NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize, unsigned long *cpuSet) { return NVML_ERROR_NOT_SUPPORTED; }
#pragma GCC diagnostic pop
