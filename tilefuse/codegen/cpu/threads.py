"""The thread pool under the CPU kernels' parallel loops, in C: the start of every kernel that has one.

GCC outlines each ``#pragma omp parallel for`` body into ``fn(data)`` and calls
``GOMP_parallel(fn, data, 0, 0)``; the body asks ``omp_get_num_threads()`` and
``omp_get_thread_num()`` for its part of the static schedule. Those three, defined here with
hidden visibility, bind inside the kernel's own library, so a kernel does not need libgomp:
its parallel loops run on this pool, which differs from libgomp where cores are shared.

- Threads that have nothing to do spin for ``TF_SPIN_NS`` and then sleep (a futex): awake
  for the next kernel of a run and the next run, yet off the core soon when idle. libgomp
  spins about 3 ms by default, burning the time slice of the thread it waits for.
- A region is split into ``team`` shares (``omp_get_num_threads()`` is the team size, as in
  OpenMP). The caller runs share 0 and worker w share w, as libgomp's threads do (so each
  keeps its rows in its cache from one kernel to the next), but a share is claimed, not
  assigned: one whose worker has not begun it is taken by a thread that has finished its
  own, the caller included. A thread that the OS has descheduled claims nothing, and the
  others do its share: the caller never waits for a thread that has not started, only for
  shares in progress (libgomp's fixed team waits at every barrier for each thread, however
  late). onnxruntime's pool works the same way.
- A share in progress on a thread the OS has descheduled (a neighbour process took its core)
  cannot be taken over: the others wait for it. The caller times each region: when it waited
  for a worker's share, or the workers for its own, ``TF_STALL_NS`` longer than uneven shares
  explain, the cores are contended, and for a while the next regions run their shares in
  turn on the calling thread (the same shares, numbered as on the pool): ``TF_ALONE_MIN_NS``
  after a first stall, doubled at each further one up to ``TF_ALONE_MAX_NS``, cut by a
  quarter by each region that then runs on the pool without one. While the cores stay
  contended a plan runs at one thread's speed instead of waiting, region after region, for a
  thread that is not running; on a quiet machine a region waits at most the difference
  between two shares, and nothing changes.
- The team size is per calling thread (``tf_threads_set``; 0 or never set: the default,
  ``OMP_NUM_THREADS`` else one per core of the process's affinity mask), so each session
  keeps its own count. A region entered while another caller has the pool, or from inside a
  region, runs its shares in turn on the calling thread.
- A host can take the regions over, per calling thread (``tf_threads_host(run, host)``,
  NULL ``run``: none): while one is set, a region of team n (n > 1) is not run on the pool
  but handed to ``run(host, share, n, arg)``, which is to call ``share(arg, i)`` for each
  i in [0, n) on its own threads, in any order, and return when they are done; each share
  runs the region's body with ``omp_get_thread_num()`` = i and ``omp_get_num_threads()`` =
  n, and a region inside it runs alone. A share runs once, however often it is handed out,
  and those the host did not run (it failed, or gave up) run on the calling thread in order
  after ``run`` returns, so a host need never fail. The onnxruntime libraries set their
  session's intra-op pool (KernelContext_ParallelFor) around each kernel call: the kernel
  starts no thread of its own there. A host with one thread runs the shares inline.

One pool serves the whole process: each kernel library carries the code, and the first one
loaded (in ``dl_iterate_phdr`` order) that exports ``tf_threads_v2`` is the one every
library uses. That library pins itself (RTLD_NODELETE) so its workers' code stays mapped.
The interface struct is versioned by name: a change to it or to its meaning is a new
``tf_threads_vN``, so libraries of different tilefuse versions in one process each use a
pool of their own version. ``tf_threads_v2`` is ``tf_threads_v1`` with the host setter
added, and its ``parallel`` hands a region to the calling thread's host. A v2 library
exports ``tf_threads_v1`` too: the same pool through the old struct with its old meaning (a
region runs on the pool, host or not), so libraries built before the hook share the pool of
a v2 library loaded before them; one loaded first keeps a v1 pool for the old ones, and the
v2 libraries use the first v2 pool. An old library has no ``tf_threads_host`` either: inside
onnxruntime its regions keep running on the pool.
"""

THREAD_POOL = r"""
/* -- the thread pool under parallel loops (instead of libgomp): see codegen/cpu/threads.py */
#define _GNU_SOURCE  /* sched_getaffinity, dladdr, pthread_setname_np */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#define TF_POOL_MAX 256       /* team size cap */
#define TF_SPIN_NS 50000      /* an idle thread spins this long before it sleeps */
#define TF_STALL_NS 200000    /* a wait this much longer than the caller's own work: a stalled share */
#define TF_ALONE_MIN_NS 2000000    /* after a stall, regions run on the caller this long at first */
#define TF_ALONE_MAX_NS 128000000  /* and at most */

typedef void (*tf_task)(void *);
struct tf_threads_v1 {        /* a pool, as the other libraries of the process see it */
    void (*parallel)(tf_task fn, void *data, unsigned team);
    int (*thread_num)(void);
    int (*num_threads)(void);
    void (*set)(int team);    /* the calling thread's team size; 0: the default */
    int (*team)(void);        /* the calling thread's team size, resolved */
    int (*fallback)(void);    /* the default */
};
/* a host's parallel-for: share(arg, i) for each i in [0, n), on the host's threads, returning
 * when they are done (onnxruntime's KernelContext_ParallelFor has this shape) */
typedef void (*tf_share_fn)(void *arg, size_t i);
typedef void (*tf_host_run)(void *host, tf_share_fn share, size_t n, void *arg);
struct tf_threads_v2 {
    struct tf_threads_v1 v1;
    void (*host)(tf_host_run run, void *host);  /* the calling thread's host; NULL run: none */
};

#define TF_WORDS (TF_POOL_MAX / 64)

/* a worker's own line: the job number it is told of (its futex word), whether it sleeps, and
 * the number it starts from */
struct tf_worker_slot { _Atomic uint32_t go, asleep; uint32_t start; char pad[52]; };
static struct {
    /* the job: fn, data and its share count are written before `avail` offers its shares
     * and stay until every share is done; avail: one bit per share not yet claimed */
    _Alignas(64) _Atomic uint64_t avail[TF_WORDS];
    _Atomic(tf_task) fn;
    _Atomic(void *) data;
    _Atomic int shares;
    _Alignas(64) _Atomic uint32_t done;  /* shares finished: the futex word a waiting caller sleeps on */
    _Atomic int waiting;
    _Alignas(64) _Atomic int busy;       /* a caller has the pool */
    _Atomic uint64_t worker_done;        /* when a worker last finished a share of the job (ns) */
    _Atomic uint64_t alone_until;        /* regions run on their callers until then (ns); 0: not */
    uint64_t alone_ns;                   /* how long the last stall sent them there: under busy */
    uint32_t epoch;                      /* jobs so far: written by the caller holding busy */
    int workers, fallback;               /* workers: started so far, changed only by that caller */
    struct tf_worker_slot slot[TF_POOL_MAX];  /* slot[w]: worker w (1 ...), runs share w first */
} tf_pool_state;
static __thread int tf_share, tf_shares = 1, tf_in_region, tf_wanted;
static __thread tf_host_run tf_host;  /* the calling thread's host, if any, and its argument */
static __thread void *tf_host_arg;
static pthread_once_t tf_pool_started = PTHREAD_ONCE_INIT;

static void tf_futex_wait(_Atomic uint32_t *word, uint32_t value) {
#ifdef __linux__
    syscall(SYS_futex, (void *)word, FUTEX_WAIT_PRIVATE, value, NULL, NULL, 0);
#else
    (void)word; (void)value; sched_yield();
#endif
}
static void tf_futex_wake(_Atomic uint32_t *word, int count) {
#ifdef __linux__
    syscall(SYS_futex, (void *)word, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
#else
    (void)word; (void)count;
#endif
}
static inline void tf_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}
static uint64_t tf_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}
/* spin while (*word == value) == equal, for at most TF_SPIN_NS: 1 once that ends, 0 if not */
static int tf_spin(_Atomic uint32_t *word, uint32_t value, int equal) {
    uint64_t until = 0;
    for (unsigned i = 1;; ++i) {
        if ((atomic_load_explicit(word, memory_order_acquire) == value) != equal) return 1;
        if ((i & 63) == 0) {
            uint64_t now = tf_now_ns();
            if (!until) until = now + TF_SPIN_NS;
            else if (now > until) return 0;
        }
        tf_relax();
    }
}

/* a share of the job in progress: `mine` if still offered, else any; -1 when none is left.
 * A claim is always of the job in progress: `avail` offers nothing between jobs. */
static int tf_claim(int mine) {
    _Atomic uint64_t *w = &tf_pool_state.avail[mine / 64];
    uint64_t bit = 1ull << (mine % 64), a = atomic_load_explicit(w, memory_order_acquire);
    while (a & bit)
        if (atomic_compare_exchange_weak_explicit(w, &a, a & ~bit, memory_order_acq_rel, memory_order_acquire))
            return mine;
    for (int k = 0; k < TF_WORDS; ++k) {
        w = &tf_pool_state.avail[k];
        a = atomic_load_explicit(w, memory_order_acquire);
        while (a)
            if (atomic_compare_exchange_weak_explicit(w, &a, a & (a - 1), memory_order_acq_rel, memory_order_acquire))
                return k * 64 + __builtin_ctzll(a);
    }
    return -1;
}
static void tf_run_share(int s, int worker) {
    tf_task fn = atomic_load_explicit(&tf_pool_state.fn, memory_order_relaxed);
    void *data = atomic_load_explicit(&tf_pool_state.data, memory_order_relaxed);
    int n = atomic_load_explicit(&tf_pool_state.shares, memory_order_relaxed);
    tf_share = s, tf_shares = n;
    fn(data);
    tf_share = 0, tf_shares = 1;
    if (worker) atomic_store_explicit(&tf_pool_state.worker_done, tf_now_ns(), memory_order_relaxed);
    if (atomic_fetch_add(&tf_pool_state.done, 1) + 1 == (uint32_t)n && atomic_load(&tf_pool_state.waiting))
        tf_futex_wake(&tf_pool_state.done, 1);
}
static void *tf_worker(void *arg) {
    int me = (int)(intptr_t)arg;
    struct tf_worker_slot *slot = &tf_pool_state.slot[me];
    uint32_t seen = slot->start;
    tf_in_region = 1;  /* a region a share opens runs alone */
    pthread_setname_np(pthread_self(), "tilefuse-pool");
    for (;;) {
        if (!tf_spin(&slot->go, seen, 1)) {
            atomic_store(&slot->asleep, 1);
            if (atomic_load(&slot->go) == seen) tf_futex_wait(&slot->go, seen);
            atomic_store(&slot->asleep, 0);
        }
        uint32_t go = atomic_load_explicit(&slot->go, memory_order_acquire);
        if (go == seen) continue;
        seen = go;
        for (int s = me; (s = tf_claim(s)) >= 0;) tf_run_share(s, 1);  /* its own share, then any left */
    }
    return NULL;
}
static void tf_grow(int workers) {  /* called with the pool held */
    if (tf_pool_state.workers >= workers) return;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);  /* workers inherit it: signals go to other threads */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    while (tf_pool_state.workers < workers) {
        int w = tf_pool_state.workers + 1;
        tf_pool_state.slot[w].start = atomic_load(&tf_pool_state.slot[w].go);  /* so it sees the next job */
        pthread_t t;
        if (pthread_create(&t, &attr, tf_worker, (void *)(intptr_t)w) != 0) break;  /* fewer: the others do more */
        tf_pool_state.workers++;
    }
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}
static void tf_alone(tf_task fn, void *data) {
    int s = tf_share, n = tf_shares, in = tf_in_region;
    tf_share = 0, tf_shares = 1, tf_in_region = 1;
    fn(data);
    tf_share = s, tf_shares = n, tf_in_region = in;
}
/* a region's n shares in turn on the calling thread, numbered as on the pool */
static void tf_in_turn(tf_task fn, void *data, int n) {
    int s = tf_share, m = tf_shares, in = tf_in_region;
    tf_in_region = 1;
    for (int i = 0; i < n; ++i) {
        tf_share = i, tf_shares = n;
        fn(data);
    }
    tf_share = s, tf_shares = m, tf_in_region = in;
}
/* whether regions run on their callers now, the cores being contended */
static int tf_contended(void) {
    uint64_t until = atomic_load_explicit(&tf_pool_state.alone_until, memory_order_relaxed);
    return until && tf_now_ns() < until;
}
/* after a region on the pool (the pool held), begun at `began`: the caller ran out of shares
 * at `worked`, the last share ended at `ended`, and a worker last finished one at `worker`
 * (0: no worker ran one). A stall: a thread off its core while the others waited for it, the
 * wait longer than what uneven shares explain (the caller's share, the first, is the largest) */
static void tf_judge(uint64_t began, uint64_t worked, uint64_t ended, uint64_t worker) {
    uint64_t alone = tf_pool_state.alone_ns;
    int stalled = ended - worked > (worked - began) + TF_STALL_NS  /* waited for a worker's share */
        || (worker && worker < worked && worked - worker > (worker - began) + TF_STALL_NS);  /* for the caller's */
    if (stalled) {
        alone = alone ? 2 * alone : TF_ALONE_MIN_NS;
        if (alone > TF_ALONE_MAX_NS) alone = TF_ALONE_MAX_NS;
        tf_pool_state.alone_ns = alone;
        atomic_store_explicit(&tf_pool_state.alone_until, ended + alone, memory_order_relaxed);
    } else if (alone) {  /* a quarter off: stalls that recur in 3 regions of 10 keep it growing */
        alone -= alone / 4;
        tf_pool_state.alone_ns = alone >= TF_ALONE_MIN_NS ? alone : 0;
        atomic_store_explicit(&tf_pool_state.alone_until, 0, memory_order_relaxed);
    }
}
/* a region handed to the calling thread's host: the shares it has begun, one bit each */
struct tf_host_job { tf_task fn; void *data; int n; _Atomic uint64_t begun[TF_WORDS]; };
static void tf_host_share(void *arg, size_t i) {
    struct tf_host_job *job = arg;
    if (i >= (size_t)job->n) return;
    uint64_t bit = 1ull << (i % 64);
    if (atomic_fetch_or(&job->begun[i / 64], bit) & bit) return;  /* handed out twice: runs once */
    int s = tf_share, n = tf_shares, in = tf_in_region;
    tf_share = (int)i, tf_shares = job->n, tf_in_region = 1;  /* a region it opens runs alone */
    job->fn(job->data);
    tf_share = s, tf_shares = n, tf_in_region = in;
}
static void tf_host_parallel(tf_task fn, void *data, int n) {
    struct tf_host_job job = {fn, data, n, {0}};
    tf_in_region = 1;
    tf_host(tf_host_arg, tf_host_share, (size_t)n, &job);
    for (int s = 0; s < n; ++s) tf_host_share(&job, (size_t)s);  /* any the host did not run */
    tf_in_region = 0;
}
/* a region on the pool, whatever the host: what a v1 caller gets */
static void tf_pool_run(tf_task fn, void *data, unsigned team) {
    int n = team ? (int)team : tf_wanted ? tf_wanted : tf_pool_state.fallback, free_ = 0;
    if (n > TF_POOL_MAX) n = TF_POOL_MAX;
    if (n <= 1 || tf_in_region || !atomic_compare_exchange_strong(&tf_pool_state.busy, &free_, 1)) {
        tf_alone(fn, data);
        return;
    }
    if (tf_contended()) {  /* holding the pool, as a region on it would */
        tf_in_turn(fn, data, n);
        atomic_store_explicit(&tf_pool_state.busy, 0, memory_order_release);
        return;
    }
    tf_grow(n - 1);
    atomic_store_explicit(&tf_pool_state.fn, fn, memory_order_relaxed);
    atomic_store_explicit(&tf_pool_state.data, data, memory_order_relaxed);
    atomic_store_explicit(&tf_pool_state.shares, n, memory_order_relaxed);
    atomic_store_explicit(&tf_pool_state.done, 0, memory_order_relaxed);
    atomic_store_explicit(&tf_pool_state.worker_done, 0, memory_order_relaxed);
    for (int k = 0; k < TF_WORDS; ++k) {  /* offer shares 1 .. n-1: share 0 is the caller's */
        int count = n - 64 * k;
        uint64_t bits = count <= 0 ? 0 : count >= 64 ? ~0ull : (1ull << count) - 1;
        atomic_store_explicit(&tf_pool_state.avail[k], k == 0 ? bits & ~1ull : bits, memory_order_release);
    }
    uint32_t epoch = ++tf_pool_state.epoch;
    for (int w = 1; w < n && w <= tf_pool_state.workers; ++w) {  /* tell the team's workers */
        struct tf_worker_slot *slot = &tf_pool_state.slot[w];
        atomic_store(&slot->go, epoch);
        if (atomic_load(&slot->asleep)) tf_futex_wake(&slot->go, 1);
    }
    tf_in_region = 1;
    uint64_t began = tf_now_ns();
    tf_run_share(0, 0);  /* the caller's own share first, so each thread keeps its rows */
    for (int s; (s = tf_claim(0)) >= 0;) tf_run_share(s, 0);  /* then any a worker has not begun */
    uint64_t worked = tf_now_ns();
    /* the shares left are in progress on workers: wait for them, spinning, then asleep */
    if (!tf_spin(&tf_pool_state.done, (uint32_t)n, 0)) {
        uint32_t d;
        atomic_store(&tf_pool_state.waiting, 1);
        while ((d = atomic_load(&tf_pool_state.done)) != (uint32_t)n) tf_futex_wait(&tf_pool_state.done, d);
        atomic_store(&tf_pool_state.waiting, 0);
    }
    uint64_t ended = tf_now_ns();
    tf_judge(began, worked, ended, atomic_load_explicit(&tf_pool_state.worker_done, memory_order_relaxed));
    tf_in_region = 0;
    atomic_store_explicit(&tf_pool_state.busy, 0, memory_order_release);
}
/* a region on the calling thread's host if it has one, else on the pool */
static void tf_pool_parallel(tf_task fn, void *data, unsigned team) {
    int n = team ? (int)team : tf_wanted ? tf_wanted : tf_pool_state.fallback;
    if (n > TF_POOL_MAX) n = TF_POOL_MAX;
    if (n > 1 && !tf_in_region && tf_host) tf_host_parallel(fn, data, n);
    else tf_pool_run(fn, data, team);
}
static int tf_pool_thread_num(void) { return tf_share; }
static int tf_pool_num_threads(void) { return tf_shares; }
static void tf_pool_set(int team) { tf_wanted = team > 0 ? (team < TF_POOL_MAX ? team : TF_POOL_MAX) : 0; }
static int tf_pool_team(void) { return tf_wanted ? tf_wanted : tf_pool_state.fallback; }
static int tf_pool_fallback(void) { return tf_pool_state.fallback; }
static void tf_pool_host(tf_host_run run, void *host) { tf_host = run, tf_host_arg = run ? host : NULL; }
static void tf_pool_after_fork(void) {  /* the child has none of the parent's workers */
    tf_pool_state.workers = 0;
    atomic_store(&tf_pool_state.busy, 0);
    atomic_store(&tf_pool_state.waiting, 0);
    atomic_store(&tf_pool_state.alone_until, 0);
    tf_pool_state.alone_ns = 0;
    for (int w = 0; w < TF_POOL_MAX; ++w) atomic_store(&tf_pool_state.slot[w].asleep, 0);
}
static const struct tf_threads_v2 tf_pool_iface = {
    {tf_pool_parallel, tf_pool_thread_num, tf_pool_num_threads, tf_pool_set, tf_pool_team, tf_pool_fallback},
    tf_pool_host};
static const struct tf_threads_v1 tf_pool_iface_v1 = {  /* the same pool, regions never hosted */
    tf_pool_run, tf_pool_thread_num, tf_pool_num_threads, tf_pool_set, tf_pool_team, tf_pool_fallback};

static void tf_pool_start(void) {
    int n = 0;
    const char *env = getenv("OMP_NUM_THREADS");  /* its first level, as OpenMP reads it */
    if (env) n = atoi(env);
    if (n <= 0) {
        cpu_set_t set;
        n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    }
    tf_pool_state.fallback = n < 1 ? 1 : (n > TF_POOL_MAX ? TF_POOL_MAX : n);
    pthread_atfork(NULL, NULL, tf_pool_after_fork);
    Dl_info self;
    if (dladdr((void *)&tf_pool_iface, &self) && self.dli_fname)  /* workers run this library's code */
        dlopen(self.dli_fname, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
}
/* this library's pool (started on first use); the process uses the first loaded one's */
const struct tf_threads_v2 *tf_threads_v2(void) {
    pthread_once(&tf_pool_started, tf_pool_start);
    return &tf_pool_iface;
}
/* the same pool for libraries built before tf_threads_v2 */
const struct tf_threads_v1 *tf_threads_v1(void) {
    tf_threads_v2();
    return &tf_pool_iface_v1;
}

static const struct tf_threads_v2 *tf_pool;  /* the process's pool */
static pthread_once_t tf_pool_found = PTHREAD_ONCE_INIT;
struct tf_names { char **names; int n, cap; };
static int tf_collect_name(struct dl_phdr_info *info, size_t size, void *out) {
    (void)size;
    struct tf_names *ns = out;
    if (info->dlpi_name && info->dlpi_name[0] && ns->n < ns->cap) ns->names[ns->n++] = strdup(info->dlpi_name);
    return 0;
}
static void tf_find_pool(void) {
    /* the loaded objects' names first, in load order, then dlopen each: no loader calls
     * inside dl_iterate_phdr's callback */
    struct tf_names ns = {calloc(4096, sizeof(char *)), 0, 4096};
    if (ns.names) dl_iterate_phdr(tf_collect_name, &ns);
    for (int i = 0; i < ns.n && !tf_pool; ++i) {
        void *lib = ns.names[i] ? dlopen(ns.names[i], RTLD_LAZY | RTLD_NOLOAD) : NULL;
        if (!lib) continue;
        const struct tf_threads_v2 *(*get)(void);
        *(void **)&get = dlsym(lib, "tf_threads_v2");
        if (get) tf_pool = get();
        dlclose(lib);
    }
    for (int i = 0; i < ns.n; ++i) free(ns.names[i]);
    free(ns.names);
    if (!tf_pool) tf_pool = tf_threads_v2();
}
static inline const struct tf_threads_v2 *tf_threads(void) {
    pthread_once(&tf_pool_found, tf_find_pool);
    return tf_pool;
}

/* what GCC's parallel loops call */
__attribute__((visibility("hidden"))) void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads,
                                                         unsigned flags) {
    (void)flags;
    tf_threads()->v1.parallel(fn, data, num_threads);
}
__attribute__((visibility("hidden"))) int omp_get_thread_num(void) { return tf_threads()->v1.thread_num(); }
__attribute__((visibility("hidden"))) int omp_get_num_threads(void) { return tf_threads()->v1.num_threads(); }

/* for the runtime: the calling thread's team size (0: the default), the default, the cap */
void tf_threads_set(int team) { tf_threads()->v1.set(team); }
int tf_threads_team(void) { return tf_threads()->v1.team(); }
int tf_threads_default(void) { return tf_threads()->v1.fallback(); }
int tf_threads_cap(void) { return TF_POOL_MAX; }
/* for the onnxruntime libraries: the calling thread's host (see codegen/cpu/threads.py) */
void tf_threads_host(tf_host_run run, void *host) { tf_threads()->host(run, host); }
"""
