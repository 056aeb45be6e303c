/* Loaded before libfaketime (LD_PRELOAD=this:libfaketime.so.1): C11 cnd_timedwait() takes an
 * absolute CLOCK_REALTIME deadline, which librdkafka computes from the faked clock; libfaketime does
 * not intercept cnd_timedwait, so the real wait compares a faked deadline with the real clock (a
 * process whose clock is faked ahead waits for hours, one faked behind never waits). This shim moves
 * the deadline back to real time by the process's current offset: faked now minus real now. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/syscall.h>
#include <threads.h>
#include <time.h>
#include <unistd.h>

static int (*real_cnd_timedwait)(cnd_t *, mtx_t *, const struct timespec *);

static long long ns(const struct timespec *t) { return (long long)t->tv_sec * 1000000000LL + t->tv_nsec; }

int cnd_timedwait(cnd_t *restrict cond, mtx_t *restrict mtx, const struct timespec *restrict deadline) {
    if (!real_cnd_timedwait)
        real_cnd_timedwait = (int (*)(cnd_t *, mtx_t *, const struct timespec *))dlsym(RTLD_NEXT, "cnd_timedwait");
    struct timespec faked, real;
    clock_gettime(CLOCK_REALTIME, &faked);              /* through libfaketime */
    syscall(SYS_clock_gettime, CLOCK_REALTIME, &real);  /* the kernel's, untouched */
    long long d = ns(deadline) - (ns(&faked) - ns(&real));
    struct timespec moved = {d / 1000000000LL, d % 1000000000LL};
    return real_cnd_timedwait(cond, mtx, &moved);
}
