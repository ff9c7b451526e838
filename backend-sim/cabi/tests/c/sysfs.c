/* What a program finds of the sim's devices outside the verbs (tests/sysfs.rs): the
 * device node UCX checks, the sysfs directories Open MPI and UCX read, with the kernel's
 * formats and the verbs' values, through every interposed libc call, under the sysfs
 * path libibverbs would use (SYSFS_PATH, else /sys). Prints one line per check and
 * exits with the number of failed checks. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <infiniband/verbs.h>

/* libibverbs exports these without declaring them in <infiniband/verbs.h> (they are in
 * its driver.h); Open MPI declares them itself too. */
const char *ibv_get_sysfs_path(void);
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);

#include "check.h"

/* The first line of `path` (without its newline), read with fopen, or "" */
static const char *line(const char *path)
{
	static char buf[4][256];
	static int next;
	char *b = buf[next++ % 4];
	b[0] = 0;
	FILE *f = fopen(path, "r");
	if (!f)
		return b;
	if (!fgets(b, 256, f))
		b[0] = 0;
	fclose(f);
	b[strcspn(b, "\n")] = 0;
	return b;
}

/* The same file read with open(2) and read(2). */
static const char *line_fd(const char *path)
{
	static char b[256];
	b[0] = 0;
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return b;
	ssize_t n = read(fd, b, sizeof(b) - 1);
	close(fd);
	b[n > 0 ? n : 0] = 0;
	b[strcspn(b, "\n")] = 0;
	return b;
}

static int listed(const char *dir, const char *name)
{
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	struct dirent *e;
	int found = 0;
	while ((e = readdir(d)))
		found |= !strcmp(e->d_name, name);
	closedir(d);
	return found;
}

int main(void)
{
	char p[512];
	struct stat st;
	const char *env = getenv("SYSFS_PATH");
	const char *sysfs = ibv_get_sysfs_path();

	/* libibverbs' answer: SYSFS_PATH without its trailing slashes, else /sys. */
	if (env) {
		size_t n = strlen(env);
		while (n > 0 && env[n - 1] == '/')
			n--;
		CHECK(strlen(sysfs) == n && !strncmp(sysfs, env, n), "sysfs path %s, SYSFS_PATH %s", sysfs, env);
	} else {
		CHECK(!strcmp(sysfs, "/sys"), "sysfs path %s", sysfs);
	}

	int num = 0;
	struct ibv_device **list = ibv_get_device_list(&num);
	CHECK(list && num >= 1, "%d devices", num);
	if (!list || num < 1)
		return 1;
	struct ibv_device *dev = list[0];
	const char *name = ibv_get_device_name(dev);

	snprintf(p, sizeof p, "%s/class/infiniband/%s", sysfs, name);
	CHECK(!strcmp(dev->ibdev_path, p), "ibdev_path %s", dev->ibdev_path);
	snprintf(p, sizeof p, "%s/class/infiniband_verbs/%s", sysfs, dev->dev_name);
	CHECK(!strcmp(dev->dev_path, p), "dev_path %s", dev->dev_path);

	/* Open MPI's openib BTL: $sysfs/class/infiniband is a directory. */
	snprintf(p, sizeof p, "%s/class/infiniband", sysfs);
	CHECK(stat(p, &st) == 0 && S_ISDIR(st.st_mode), "stat %s", p);
	CHECK(listed(p, name), "%s in %s", name, p);
	/* UCX names /sys itself. */
	CHECK(stat("/sys/class/infiniband", &st) == 0 && S_ISDIR(st.st_mode), "stat /sys/class/infiniband");

	/* UCX's uct_ib_device_is_accessible(): a character device it may read and write. */
	snprintf(p, sizeof p, "/dev/infiniband/%s", dev->dev_name);
	CHECK(stat(p, &st) == 0 && S_ISCHR(st.st_mode), "stat %s: mode %o", p, st.st_mode);
	CHECK(lstat(p, &st) == 0 && S_ISCHR(st.st_mode), "lstat %s: mode %o", p, st.st_mode);
	CHECK(fstatat(AT_FDCWD, p, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISCHR(st.st_mode), "fstatat %s", p);
	struct statx sx;
	CHECK(statx(AT_FDCWD, p, 0, STATX_TYPE, &sx) == 0 && S_ISCHR(sx.stx_mode), "statx %s", p);
	CHECK(access(p, R_OK | W_OK) == 0, "access %s", p);
	CHECK(faccessat(AT_FDCWD, p, R_OK | W_OK, 0) == 0, "faccessat %s", p);
	int fd = open(p, O_RDWR | O_CLOEXEC);
	CHECK(fd >= 0, "open %s", p);
	if (fd >= 0)
		close(fd);
	fd = openat(AT_FDCWD, p, O_RDWR);
	CHECK(fd >= 0, "openat %s", p);
	if (fd >= 0)
		close(fd);
	CHECK(listed("/dev/infiniband", dev->dev_name), "%s in /dev/infiniband", dev->dev_name);

	/* The uverbs class names the device. */
	snprintf(p, sizeof p, "%s/ibdev", dev->dev_path);
	CHECK(!strcmp(line(p), name), "%s: %s", p, line(p));
	snprintf(p, sizeof p, "%s/class/infiniband_verbs/abi_version", sysfs);
	CHECK(!strcmp(line(p), "6"), "%s: %s", p, line(p));

	/* Node files, with the verbs' values. */
	struct ibv_context *ctx = ibv_open_device(dev);
	CHECK(ctx != NULL, "ibv_open_device");
	if (!ctx)
		return 1;
	struct ibv_device_attr da;
	CHECK(ibv_query_device(ctx, &da) == 0, "ibv_query_device");
	snprintf(p, sizeof p, "%s/node_type", dev->ibdev_path);
	CHECK(!strcmp(line(p), "1: CA"), "%s: %s", p, line(p));
	CHECK(!strcmp(line_fd(p), "1: CA"), "%s read with open: %s", p, line_fd(p));
	snprintf(p, sizeof p, "%s/fw_ver", dev->ibdev_path);
	CHECK(!strcmp(line(p), da.fw_ver), "%s: %s, ibv_query_device %s", p, line(p), da.fw_ver);
	uint64_t g = be64toh(da.node_guid);
	char want[64];
	snprintf(want, sizeof want, "%04x:%04x:%04x:%04x", (unsigned)(g >> 48) & 0xffff,
		 (unsigned)(g >> 32) & 0xffff, (unsigned)(g >> 16) & 0xffff, (unsigned)g & 0xffff);
	snprintf(p, sizeof p, "%s/node_guid", dev->ibdev_path);
	CHECK(!strcmp(line(p), want), "%s: %s, ibv_query_device %s", p, line(p), want);
	char buf[64];
	CHECK(ibv_read_sysfs_file(dev->ibdev_path, "board_id", buf, sizeof buf) > 0 &&
		      !strcmp(buf, "VERBS-RS-SIM"),
	      "ibv_read_sysfs_file board_id: %s", buf);

	/* Port files, once the device is open: the verbs' values. */
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(ctx, 1, &pa) == 0, "ibv_query_port");
	int eth = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
	snprintf(p, sizeof p, "%s/ports/1/link_layer", dev->ibdev_path);
	CHECK(!strcmp(line(p), eth ? "Ethernet" : "InfiniBand"), "%s: %s", p, line(p));
	snprintf(p, sizeof p, "%s/ports/1/state", dev->ibdev_path);
	CHECK(!strcmp(line(p), "4: ACTIVE"), "%s: %s", p, line(p));
	snprintf(p, sizeof p, "%s/ports/1/lid", dev->ibdev_path);
	snprintf(want, sizeof want, "0x%x", pa.lid);
	CHECK(!strcmp(line(p), want), "%s: %s, ibv_query_port %s", p, line(p), want);
	for (int i = 0; i < 2; i++) {
		union ibv_gid gid;
		CHECK(ibv_query_gid(ctx, 1, i, &gid) == 0, "ibv_query_gid %d", i);
		char *w = want;
		for (int k = 0; k < 16; k += 2)
			w += sprintf(w, "%s%02x%02x", k ? ":" : "", gid.raw[k], gid.raw[k + 1]);
		snprintf(p, sizeof p, "%s/ports/1/gids/%d", dev->ibdev_path, i);
		CHECK(!strcmp(line(p), want), "%s: %s, ibv_query_gid %s", p, line(p), want);
		/* UCX: the GID's type (RoCE v2 picks the RoCE GID), on RoCE its netdev. */
		snprintf(p, sizeof p, "%s/ports/1/gid_attrs/types/%d", dev->ibdev_path, i);
		CHECK(!strcmp(line(p), eth ? "RoCE v2" : "IB/RoCE v1"), "%s: %s", p, line(p));
		snprintf(p, sizeof p, "%s/ports/1/gid_attrs/ndevs/%d", dev->ibdev_path, i);
		if (eth)
			CHECK(!strcmp(line(p), "lo"), "%s: %s (the loopback addresses are lo's)", p, line(p));
		else
			CHECK(access(p, F_OK) != 0, "%s exists on an InfiniBand port", p);
	}

	/* Elsewhere the host's file system answers. */
	CHECK(stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode), "stat /dev/null");
	CHECK(access("/proc/self/status", R_OK) == 0, "access /proc/self/status");
	CHECK(stat("/sys/class/infiniband_no_such_class", &st) != 0 && errno == ENOENT, "a sibling of the class");
	CHECK(opendir("/proc/self") != NULL, "opendir /proc/self");

	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("%d failed\n", failures);
	return failures;
}
