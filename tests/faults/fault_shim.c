// A fault-injection library for the `faults` test tier, loaded with LD_PRELOAD into kdalab. It acts only on
// kdalab's temporaries (a file whose name holds ".tmp.") and on the final rename, as the environment says:
//   KDALAB_FAULT_ENOSPC_AFTER=N        write() to a temporary fails with ENOSPC once N bytes were written
//   KDALAB_FAULT_ENOSPC_ON_CREATE=1    creating a temporary fails with ENOSPC
//   KDALAB_FAULT_EIO_ON_FSYNC=1        fsync() of a temporary fails with EIO
//   KDALAB_FAULT_SLOW_WRITE_MS=M       each write() to a temporary first sleeps M ms (a signal can be sent meanwhile)
//   KDALAB_FAULT_CREATE_BEFORE_RENAME=1  the rename's target is created (text "racer") just before the rename
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long env_long(const char* name) {
  const char* v = getenv(name);
  return v ? atol(v) : 0;
}

static int is_temporary_fd(int fd) {
  char link[64], target[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0) return 0;
  target[n] = '\0';
  return strstr(target, ".tmp.") != NULL;
}

static long long written = 0;

ssize_t write(int fd, const void* buf, size_t count) {
  static ssize_t (*real)(int, const void*, size_t) = NULL;
  if (!real) real = (ssize_t(*)(int, const void*, size_t))dlsym(RTLD_NEXT, "write");
  if (fd > 2 && is_temporary_fd(fd)) {
    const long ms = env_long("KDALAB_FAULT_SLOW_WRITE_MS");
    if (ms > 0) {
      struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
    const char* lim = getenv("KDALAB_FAULT_ENOSPC_AFTER");
    if (lim) {
      const long long room = atoll(lim) - written;
      if (room <= 0) {
        errno = ENOSPC;
        return -1;
      }
      if ((long long)count > room) count = (size_t)room;
    }
    const ssize_t n = real(fd, buf, count);
    if (n > 0) written += n;
    return n;
  }
  return real(fd, buf, count);
}

int fsync(int fd) {
  static int (*real)(int) = NULL;
  if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
  if (env_long("KDALAB_FAULT_EIO_ON_FSYNC") && is_temporary_fd(fd)) {
    errno = EIO;
    return -1;
  }
  return real(fd);
}

int openat(int dirfd, const char* path, int flags, ...) {
  static int (*real)(int, const char*, int, ...) = NULL;
  if (!real) real = (int (*)(int, const char*, int, ...))dlsym(RTLD_NEXT, "openat");
  mode_t mode = 0;
  if (flags & (O_CREAT | __O_TMPFILE)) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, mode_t);
    va_end(ap);
  }
  if ((flags & O_CREAT) && strstr(path, ".tmp.") && env_long("KDALAB_FAULT_ENOSPC_ON_CREATE")) {
    errno = ENOSPC;
    return -1;
  }
  return real(dirfd, path, flags, mode);
}

static void create_racer(int dirfd, const char* path) {
  if (!env_long("KDALAB_FAULT_CREATE_BEFORE_RENAME")) return;
  static int (*real_openat)(int, const char*, int, ...) = NULL;
  if (!real_openat) real_openat = (int (*)(int, const char*, int, ...))dlsym(RTLD_NEXT, "openat");
  const int fd = real_openat(dirfd, path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    static ssize_t (*real_write)(int, const void*, size_t) = NULL;
    if (!real_write) real_write = (ssize_t(*)(int, const void*, size_t))dlsym(RTLD_NEXT, "write");
    (void)real_write(fd, "racer", 5);
    close(fd);
  }
}

int renameat2(int olddirfd, const char* oldpath, int newdirfd, const char* newpath, unsigned int flags) {
  static int (*real)(int, const char*, int, const char*, unsigned int) = NULL;
  if (!real) real = (int (*)(int, const char*, int, const char*, unsigned int))dlsym(RTLD_NEXT, "renameat2");
  create_racer(newdirfd, newpath);
  return real(olddirfd, oldpath, newdirfd, newpath, flags);
}

int renameat(int olddirfd, const char* oldpath, int newdirfd, const char* newpath) {
  static int (*real)(int, const char*, int, const char*) = NULL;
  if (!real) real = (int (*)(int, const char*, int, const char*))dlsym(RTLD_NEXT, "renameat");
  create_racer(newdirfd, newpath);
  return real(olddirfd, oldpath, newdirfd, newpath);
}
