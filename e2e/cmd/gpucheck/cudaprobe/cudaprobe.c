/*
 * cudaprobe runs inside a GPU container that gpu-check starts with runc. It
 * does what a CUDA program does first: dlopen libcuda.so.1 (found through the
 * container's ld cache, which our CDI hook updates), cuInit, count the
 * devices, and name each one. It also lists the GPU device nodes it can see
 * and what `/sbin/ldconfig -p` says about the driver's libraries, then prints
 * one line, "cudaprobe: {json}", and exits 0 whatever it found: gpu-check
 * judges the answer.
 *
 * Opt-in, through its environment:
 *   CUDAPROBE_LIST=DIR[:DIR...]  lists each directory's entries ("listed"),
 *                                to show what a container's mounts hold;
 *   CUDAPROBE_ALLOC_MIB=N        after cuInit, creates a context on device 0
 *                                and allocates N MiB there, reporting the
 *                                CUresults ("ctxCreate", "memAlloc") and what
 *                                cuMemGetInfo says: an MPS memory limit shows
 *                                as a refused allocation;
 *   CUDAPROBE_HOLD=S             after printing, keeps the context and the
 *                                allocation until stdin closes, at most S
 *                                seconds, so that another container can try
 *                                its own while this one holds.
 *
 * Built with the C library of the machine that builds the gpu-check bundle;
 * that library is copied into the container's image, so the probe needs
 * nothing from the node except what the CDI spec injects.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int (*cu_init_t)(unsigned int);
typedef int (*cu_int_t)(int *);
typedef int (*cu_get_t)(int *, int);
typedef int (*cu_name_t)(char *, int, int);
typedef int (*cu_uuid_t)(unsigned char *, int);
typedef int (*cu_ctx_create_t)(void **, unsigned int, int);
typedef int (*cu_mem_info_t)(size_t *, size_t *);
typedef int (*cu_mem_alloc_t)(unsigned long long *, size_t);

static void json_str(const char *s) {
	putchar('"');
	for (; s && *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

/* ldconfig prints the ld cache; only the driver's lines are kept. */
static void ldconfig_lines(void) {
	int fds[2];
	printf(",\"ldconfig\":[");
	if (pipe(fds) != 0) {
		printf("],\"ldconfigError\":\"pipe failed\"");
		return;
	}
	pid_t pid = fork();
	if (pid == 0) {
		dup2(fds[1], 1);
		close(fds[0]);
		execl("/sbin/ldconfig", "ldconfig", "-p", (char *)NULL);
		_exit(127);
	}
	close(fds[1]);
	FILE *f = fdopen(fds[0], "r");
	char line[1024];
	int first = 1;
	while (f && fgets(line, sizeof line, f)) {
		line[strcspn(line, "\n")] = 0;
		if (!strstr(line, "cuda") && !strstr(line, "nvidia"))
			continue;
		char *t = line;
		while (isspace((unsigned char)*t))
			t++;
		if (!first)
			putchar(',');
		first = 0;
		json_str(t);
	}
	if (f)
		fclose(f);
	int status = 0;
	waitpid(pid, &status, 0);
	printf("]");
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		printf(",\"ldconfigError\":\"/sbin/ldconfig -p exited with status %d\"", status);
}

/* The GPU nodes a CUDA program could open: /dev/nvidia<N>. */
static void dev_nodes(void) {
	printf(",\"devNodes\":[");
	DIR *d = opendir("/dev");
	int first = 1;
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (strncmp(e->d_name, "nvidia", 6) != 0)
			continue;
		char path[300];
		struct stat st;
		snprintf(path, sizeof path, "/dev/%s", e->d_name);
		if (stat(path, &st) != 0 || !S_ISCHR(st.st_mode))
			continue;
		if (!first)
			putchar(',');
		first = 0;
		json_str(path);
	}
	if (d)
		closedir(d);
	printf("]");
}

/* The entries of each directory CUDAPROBE_LIST names ("listed"), and why one could not be
 * read ("listErrors"). */
static void list_dirs(void) {
	const char *list = getenv("CUDAPROBE_LIST");
	if (!list || !*list)
		return;
	for (int errors = 0; errors <= 1; errors++) {
		char *copy = strdup(list), *save = NULL;
		int first = 1;
		for (char *dir = strtok_r(copy, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
			DIR *d = opendir(dir);
			int why = errno;
			if ((d == NULL) != errors) {
				if (d)
					closedir(d);
				continue;
			}
			printf("%s", first ? (errors ? ",\"listErrors\":{" : ",\"listed\":{") : ",");
			first = 0;
			json_str(dir);
			if (errors) {
				putchar(':');
				json_str(strerror(why));
				continue;
			}
			printf(":[");
			int n = 0;
			struct dirent *e;
			while ((e = readdir(d))) {
				if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
					continue;
				printf("%s", n++ ? "," : "");
				json_str(e->d_name);
			}
			closedir(d);
			printf("]");
		}
		if (!first)
			printf("}");
		free(copy);
	}
}

/* CUDAPROBE_ALLOC_MIB: a context on device 0 and N MiB allocated in it, kept for CUDAPROBE_HOLD. */
static void alloc(void *h) {
	const char *mib_s = getenv("CUDAPROBE_ALLOC_MIB");
	if (!mib_s || !*mib_s)
		return;
	unsigned long long mib = strtoull(mib_s, NULL, 10);
	printf(",\"allocMiB\":%llu", mib);
	cu_get_t cu_get = (cu_get_t)dlsym(h, "cuDeviceGet");
	cu_ctx_create_t cu_ctx_create = (cu_ctx_create_t)dlsym(h, "cuCtxCreate_v2");
	cu_mem_info_t cu_mem_info = (cu_mem_info_t)dlsym(h, "cuMemGetInfo_v2");
	cu_mem_alloc_t cu_mem_alloc = (cu_mem_alloc_t)dlsym(h, "cuMemAlloc_v2");
	if (!cu_get || !cu_ctx_create || !cu_mem_alloc) {
		printf(",\"allocError\":\"libcuda.so.1 lacks cuDeviceGet, cuCtxCreate_v2 or cuMemAlloc_v2\"");
		return;
	}
	int dev = 0;
	int r = cu_get(&dev, 0);
	if (r != 0) {
		printf(",\"allocError\":\"cuDeviceGet(0): CUresult %d\"", r);
		return;
	}
	void *ctx = NULL;
	r = cu_ctx_create(&ctx, 0, dev);
	printf(",\"ctxCreate\":%d", r);
	if (r != 0)
		return;
	size_t free_b = 0, total_b = 0;
	if (cu_mem_info && cu_mem_info(&free_b, &total_b) == 0)
		printf(",\"memFreeMiB\":%zu,\"memTotalMiB\":%zu", free_b >> 20, total_b >> 20);
	unsigned long long ptr = 0;
	r = cu_mem_alloc(&ptr, (size_t)mib << 20);
	printf(",\"memAlloc\":%d", r);
}

/* probe prints the report's fields after the first. */
static void probe(void) {
	dev_nodes();
	list_dirs();
	ldconfig_lines();
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!h) {
		printf(",\"dlopenError\":");
		json_str(dlerror());
		return;
	}
	Dl_info info;
	void *init_sym = dlsym(h, "cuInit");
	if (init_sym && dladdr(init_sym, &info) && info.dli_fname) {
		printf(",\"library\":");
		json_str(info.dli_fname);
	}
	/* The mock node's stand-in says so, so that no report mistakes it for CUDA. */
	printf(",\"mockLibrary\":%s", dlsym(h, "gpu_device_plugin_mock_libcuda") ? "true" : "false");
	cu_init_t cu_init = (cu_init_t)init_sym;
	cu_int_t cu_version = (cu_int_t)dlsym(h, "cuDriverGetVersion");
	cu_int_t cu_count = (cu_int_t)dlsym(h, "cuDeviceGetCount");
	cu_get_t cu_get = (cu_get_t)dlsym(h, "cuDeviceGet");
	cu_name_t cu_name = (cu_name_t)dlsym(h, "cuDeviceGetName");
	cu_uuid_t cu_uuid = (cu_uuid_t)dlsym(h, "cuDeviceGetUuid_v2");
	if (!cu_uuid)
		cu_uuid = (cu_uuid_t)dlsym(h, "cuDeviceGetUuid");
	if (!cu_init || !cu_count) {
		printf(",\"symbolError\":\"libcuda.so.1 lacks cuInit or cuDeviceGetCount\"");
		return;
	}
	int r = cu_init(0);
	printf(",\"cuInit\":%d", r);
	int version = 0;
	if (cu_version && cu_version(&version) == 0)
		printf(",\"driverVersion\":%d", version);
	if (r != 0)
		return;
	int count = -1;
	r = cu_count(&count);
	printf(",\"cuDeviceGetCount\":%d,\"count\":%d,\"devices\":[", r, count);
	for (int i = 0; r == 0 && i < count; i++) {
		int dev = i;
		char name[256] = "";
		unsigned char u[16] = {0};
		if (cu_get)
			cu_get(&dev, i);
		if (cu_name)
			cu_name(name, sizeof name, dev);
		char uuid[64] = "";
		if (cu_uuid && cu_uuid(u, dev) == 0)
			snprintf(uuid, sizeof uuid,
				 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
				 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
				 u[13], u[14], u[15]);
		printf("%s{\"name\":", i ? "," : "");
		json_str(name);
		printf(",\"uuid\":");
		json_str(uuid);
		printf("}");
	}
	printf("]");
	if (r == 0 && count > 0)
		alloc(h);
}

/* hold keeps the process, and so its context and allocation, until stdin closes or the alarm. */
static void hold(void) {
	const char *s = getenv("CUDAPROBE_HOLD");
	if (!s || !*s)
		return;
	alarm((unsigned)strtoul(s, NULL, 10));
	char buf[256];
	while (read(0, buf, sizeof buf) > 0)
		;
}

int main(void) {
	printf("cudaprobe: {\"visibleDevices\":");
	json_str(getenv("NVIDIA_VISIBLE_DEVICES") ? getenv("NVIDIA_VISIBLE_DEVICES") : "");
	probe();
	printf("}\n");
	fflush(stdout);
	hold();
	return 0;
}
