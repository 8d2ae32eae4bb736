/* A SIGSYS handler for the seccomp proofs: when the filter traps a call, say which call,
 * with which first two arguments, from where, then die of SIGSYS as the kill filter would.
 *
 * The filter returns SECCOMP_RET_TRAP, so the kernel delivers SIGSYS to the thread that made
 * the call, with si_syscall set. The handler writes one line and a backtrace to stderr with
 * write(2) only (no allocation: the process is under the filter), resets SIGSYS to its default
 * and sends it to the whole process, so the parent still sees a death by SIGSYS.
 *
 * serwatt_sigsys_install() is called before the filter: it loads libgcc's unwinder (the first
 * backtrace() does, with dlopen, which maps memory) so the handler's backtrace maps nothing.
 */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static void put(const char *s) { (void)!write(2, s, strlen(s)); }

static void put_hex(unsigned long v) {
    char buf[19] = "0x";
    int n = 0;
    char digits[16];
    do {
        digits[n++] = "0123456789abcdef"[v & 0xf];
        v >>= 4;
    } while (v && n < 16);
    for (int i = 0; i < n; i++) buf[2 + i] = digits[n - 1 - i];
    buf[2 + n] = 0;
    put(buf);
}

static void on_sigsys(int sig, siginfo_t *info, void *uctx) {
    (void)sig;
    unsigned long a0 = 0, a1 = 0;
    ucontext_t *uc = (ucontext_t *)uctx;
#if defined(__x86_64__)
    a0 = (unsigned long)uc->uc_mcontext.gregs[REG_RDI];
    a1 = (unsigned long)uc->uc_mcontext.gregs[REG_RSI];
#elif defined(__aarch64__)
    a0 = (unsigned long)uc->uc_mcontext.regs[0];
    a1 = (unsigned long)uc->uc_mcontext.regs[1];
#else
    (void)uc;
#endif
    put("SERWATT-SIGSYS syscall=");
    put_hex((unsigned long)info->si_syscall);
    put(" arg0=");
    put_hex(a0);
    put(" arg1=");
    put_hex(a1);
    put(" tid=");
    put_hex((unsigned long)syscall(SYS_gettid));
    put("\n");
    void *frames[48];
    int n = backtrace(frames, 48);
    backtrace_symbols_fd(frames, n, 2);
    put("SERWATT-SIGSYS end\n");
    signal(SIGSYS, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGSYS);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    kill(getpid(), SIGSYS);
    _exit(128 + SIGSYS); /* not reached */
}

int serwatt_sigsys_install(void) {
    void *warm[4];
    backtrace(warm, 4);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigsys;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGSYS, &sa, NULL);
}
