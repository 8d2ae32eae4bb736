/* Counting (and optionally trapping) allocator shim, loaded with LD_PRELOAD.
 *
 * Every C-level allocation entry point of glibc is wrapped: malloc, calloc, realloc,
 * reallocarray, posix_memalign, aligned_alloc, memalign, valloc, pvalloc (and free, counted
 * apart: it is not an allocation). Between serwatt_alloc_begin() and serwatt_alloc_end()
 * (called from Python through ctypes) each call is counted, from every thread, with its
 * size; the first SERWATT_EVENTS calls also keep a short backtrace so the Python side can
 * name the caller (dladdr). With SERWATT_ALLOC_TRAP=1 in the environment, the first counted
 * allocation writes its kind to stderr and aborts (SIGABRT): the trapping allocator.
 *
 * The wrappers call glibc's own __libc_* entry points (exported by glibc), so no dlsym
 * bootstrap is needed and nothing here allocates.
 *
 * Build: cc -O2 -shared -fPIC -o libserwatt_alloc_shim.so alloc_shim.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <execinfo.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);
extern void __libc_free(void *);

enum {
    K_MALLOC,
    K_CALLOC,
    K_REALLOC,
    K_REALLOCARRAY,
    K_POSIX_MEMALIGN,
    K_ALIGNED_ALLOC,
    K_MEMALIGN,
    K_VALLOC,
    K_PVALLOC,
    K_FREE,
    K_KINDS
};

static const char *const kind_names[K_KINDS] = {
    "malloc", "calloc", "realloc", "reallocarray", "posix_memalign",
    "aligned_alloc", "memalign", "valloc", "pvalloc", "free",
};

#define SERWATT_EVENTS 512
#define SERWATT_DEPTH 16

/* Read from Python with ctypes (c_uint64 * K_KINDS).in_dll(...). */
uint64_t serwatt_alloc_counts[K_KINDS];
uint64_t serwatt_alloc_bytes[K_KINDS];
uint64_t serwatt_alloc_event_count;
uint64_t serwatt_alloc_event_kind[SERWATT_EVENTS];
uint64_t serwatt_alloc_event_size[SERWATT_EVENTS];
uint64_t serwatt_alloc_event_depth[SERWATT_EVENTS];
/* The same counts for the thread that called serwatt_alloc_begin() alone, and per event
 * whether it came from that thread (1) or another one (0): a hot path that hands work to a
 * background thread is measured on the caller's side apart from the background's. */
uint64_t serwatt_alloc_counts_begin_thread[K_KINDS];
uint64_t serwatt_alloc_bytes_begin_thread[K_KINDS];
uint64_t serwatt_alloc_event_begin_thread[SERWATT_EVENTS];
uint64_t serwatt_alloc_max_size; /* the largest counted allocation, any thread */
void *serwatt_alloc_event_frames[SERWATT_EVENTS][SERWATT_DEPTH];
const int serwatt_alloc_kinds = K_KINDS;
const int serwatt_alloc_events_max = SERWATT_EVENTS;
const int serwatt_alloc_depth_max = SERWATT_DEPTH;

static volatile int armed;
static int trap;
static __thread int in_shim; /* backtrace() may allocate on its first call */
static __thread int on_begin_thread;

const char *serwatt_alloc_kind_name(int k) { return k >= 0 && k < K_KINDS ? kind_names[k] : ""; }

void serwatt_alloc_begin(void) {
    memset(serwatt_alloc_counts, 0, sizeof serwatt_alloc_counts);
    memset(serwatt_alloc_bytes, 0, sizeof serwatt_alloc_bytes);
    memset(serwatt_alloc_counts_begin_thread, 0, sizeof serwatt_alloc_counts_begin_thread);
    memset(serwatt_alloc_bytes_begin_thread, 0, sizeof serwatt_alloc_bytes_begin_thread);
    serwatt_alloc_event_count = 0;
    serwatt_alloc_max_size = 0;
    on_begin_thread = 1;
    __atomic_store_n(&armed, 1, __ATOMIC_SEQ_CST);
}

void serwatt_alloc_end(void) {
    __atomic_store_n(&armed, 0, __ATOMIC_SEQ_CST);
    on_begin_thread = 0;
}

static void note(int kind, size_t size) {
    if (!__atomic_load_n(&armed, __ATOMIC_RELAXED) || in_shim) return;
    if (trap && kind != K_FREE) {
        static const char head[] = "serwatt alloc shim: trapped ";
        static const char tail[] = " between serwatt_alloc_begin and serwatt_alloc_end\n";
        const char *name = kind_names[kind];
        ssize_t ignored = write(2, head, sizeof head - 1);
        ignored = write(2, name, strlen(name));
        ignored = write(2, tail, sizeof tail - 1);
        (void)ignored;
        abort();
    }
    __atomic_fetch_add(&serwatt_alloc_counts[kind], 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&serwatt_alloc_bytes[kind], size, __ATOMIC_RELAXED);
    if (on_begin_thread) {
        serwatt_alloc_counts_begin_thread[kind]++;
        serwatt_alloc_bytes_begin_thread[kind] += size;
    }
    if (kind == K_FREE) return;
    uint64_t seen = __atomic_load_n(&serwatt_alloc_max_size, __ATOMIC_RELAXED);
    while (size > seen && !__atomic_compare_exchange_n(&serwatt_alloc_max_size, &seen, size, 0,
                                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    uint64_t slot = __atomic_fetch_add(&serwatt_alloc_event_count, 1, __ATOMIC_RELAXED);
    if (slot < SERWATT_EVENTS) {
        in_shim = 1;
        serwatt_alloc_event_kind[slot] = (uint64_t)kind;
        serwatt_alloc_event_size[slot] = size;
        serwatt_alloc_event_begin_thread[slot] = (uint64_t)on_begin_thread;
        serwatt_alloc_event_depth[slot] =
            (uint64_t)backtrace(serwatt_alloc_event_frames[slot], SERWATT_DEPTH);
        in_shim = 0;
    }
}

__attribute__((constructor)) static void serwatt_alloc_init(void) {
    const char *t = getenv("SERWATT_ALLOC_TRAP");
    trap = t != NULL && t[0] == '1';
    void *frames[2];
    in_shim = 1;
    backtrace(frames, 2); /* loads libgcc_s now, not inside a counted call */
    in_shim = 0;
}

void *malloc(size_t n) {
    note(K_MALLOC, n);
    return __libc_malloc(n);
}

void *calloc(size_t n, size_t size) {
    note(K_CALLOC, n * size);
    return __libc_calloc(n, size);
}

void *realloc(void *p, size_t n) {
    note(K_REALLOC, n);
    return __libc_realloc(p, n);
}

void *reallocarray(void *p, size_t n, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    note(K_REALLOCARRAY, total);
    return __libc_realloc(p, total);
}

int posix_memalign(void **out, size_t align, size_t n) {
    if (align % sizeof(void *) != 0 || (align & (align - 1)) != 0 || align == 0) return EINVAL;
    note(K_POSIX_MEMALIGN, n);
    void *p = __libc_memalign(align, n);
    if (p == NULL) return ENOMEM;
    *out = p;
    return 0;
}

void *aligned_alloc(size_t align, size_t n) {
    note(K_ALIGNED_ALLOC, n);
    return __libc_memalign(align, n);
}

void *memalign(size_t align, size_t n) {
    note(K_MEMALIGN, n);
    return __libc_memalign(align, n);
}

void *valloc(size_t n) {
    note(K_VALLOC, n);
    return __libc_valloc(n);
}

void *pvalloc(size_t n) {
    note(K_PVALLOC, n);
    return __libc_pvalloc(n);
}

void free(void *p) {
    if (p != NULL) note(K_FREE, 0);
    __libc_free(p);
}
