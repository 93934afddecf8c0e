/* Which vector path runs: the best this build holds and this CPU has, or the caller's choice. */
#if defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE 1   /* madvise, posix_memalign under -std=c11 */
#endif
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "skn_internal.h"

#define SKN_HUGE ((size_t)1 << 21)

void *skn_big_alloc(size_t n)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (n >= SKN_HUGE) {
        void *p = NULL;
        if (posix_memalign(&p, SKN_HUGE, n) != 0) return NULL;
        madvise(p, (n + SKN_HUGE - 1) & ~(SKN_HUGE - 1), MADV_HUGEPAGE);
        return p;
    }
#endif
    return malloc(n);
}

void skn_hint_huge(void *p, size_t n)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t a = ((uintptr_t)p + SKN_HUGE - 1) & ~(uintptr_t)(SKN_HUGE - 1);
    const uintptr_t b = ((uintptr_t)p + n) & ~(uintptr_t)(SKN_HUGE - 1);
    if (b > a) madvise((void *)a, b - a, MADV_HUGEPAGE);
#else
    (void)p;
    (void)n;
#endif
}

extern const skn_kernels skn_kernels_scalar;
#if defined(__x86_64__) || defined(_M_X64)
#define SKN_X86 1
extern const skn_kernels skn_kernels_sse4;
#ifndef SKN_NO_AVX2
extern const skn_kernels skn_kernels_avx2;
#endif
#endif
#if defined(__aarch64__)
extern const skn_kernels skn_kernels_neon;
#endif

static const skn_kernels *g_kern;

static int cpu_has(const char *name)
{
    if (!strcmp(name, "scalar")) return 1;
#if defined(SKN_X86) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (!strcmp(name, "sse4")) return __builtin_cpu_supports("sse4.2");   /* (every SSE4.2 CPU has POPCNT) */
#ifndef SKN_NO_AVX2
    if (!strcmp(name, "avx2")) return __builtin_cpu_supports("avx2");   /* (every AVX2 CPU has F16C) */
#endif
#endif
#if defined(__aarch64__)
    if (!strcmp(name, "neon")) return 1;   /* Advanced SIMD is part of every AArch64 core */
#endif
    return 0;
}

static const skn_kernels *const *all_paths(void)
{
    static const skn_kernels *const paths[] = {
        &skn_kernels_scalar,
#ifdef SKN_X86
        &skn_kernels_sse4,
#ifndef SKN_NO_AVX2
        &skn_kernels_avx2,
#endif
#endif
#if defined(__aarch64__)
        &skn_kernels_neon,
#endif
        NULL};
    return paths;
}

static const skn_kernels *best(void)
{
    const skn_kernels *k = &skn_kernels_scalar;
    for (const skn_kernels *const *p = all_paths(); *p; p++)
        if (cpu_has((*p)->name)) k = *p;
    return k;
}

const skn_kernels *skn_kernels_get(void)
{
    if (!g_kern) g_kern = best();
    return g_kern;
}

const char *skn_path_name(void) { return skn_kernels_get()->name; }

int skn_set_path(const char *name)
{
    if (!name || !strcmp(name, "auto")) { g_kern = best(); return SKN_OK; }
    for (const skn_kernels *const *p = all_paths(); *p; p++)
        if (!strcmp((*p)->name, name)) {
            if (!cpu_has(name)) return SKN_E_UNSUPPORTED;
            g_kern = *p;
            return SKN_OK;
        }
    return SKN_E_UNSUPPORTED;
}

const char *skn_paths_available(void)
{
    static char buf[64];
    if (!buf[0]) {
        char tmp[64] = "";
        for (const skn_kernels *const *p = all_paths(); *p; p++)
            if (cpu_has((*p)->name)) {
                if (tmp[0]) strcat(tmp, ",");
                strcat(tmp, (*p)->name);
            }
        memcpy(buf, tmp, sizeof buf);
    }
    return buf;
}

int skn_block_channels(int n)
{
    int cb = (1 << 16) / (n * n);
    return cb > 64 ? 64 : cb < 32 ? 32 : cb;
}

int skn_row_stride(int n) { return n * skn_block_channels(n) + 16; }

const char *skn_version(void) { return "1.0.0"; }

const char *skn_strerror(int s)
{
    switch (s) {
    case SKN_OK: return "ok";
    case SKN_E_ARG: return "bad argument";
    case SKN_E_NOMEM: return "out of memory";
    case SKN_E_HEADER: return "header value out of range";
    case SKN_E_PAYLOAD: return "payload malformed";
    case SKN_E_RANS_WORDS: return "entropy-coded stream runs out of words";
    case SKN_E_RANS_STATE: return "entropy-coded stream ends in a wrong state (wrong tables or corrupt data)";
    case SKN_E_RANS_LEFTOVER: return "entropy-coded stream has leftover words (wrong tables or corrupt data)";
    case SKN_E_RANS_LAYOUT: return "entropy-coded stream has a bad piece table";
    case SKN_E_COVER: return "symbols do not cover the bands";
    case SKN_E_TABLE: return "table missing or of the wrong shape";
    case SKN_E_NONFINITE: return "decoded values are not finite";
    case SKN_E_ORDER: return "call out of order";
    case SKN_E_UNSUPPORTED: return "not supported by the native decoder";
    case SKN_E_LIMIT: return "shape over the size limit";
    default: return "unknown error";
    }
}
