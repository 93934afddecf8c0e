/* The test-vector runner: decodes case files (skn_case.h) and compares the SHA-256 of the fp16
 * output with the recorded one. For the host and for cross builds run under qemu:
 *   skn_vectors [--path NAME] [--expect-path NAME] CASE...
 * prints the vector path that ran, one line per case, and exits 0 only if every case matched
 * (and, with --expect-path, the path that ran is NAME: a scalar fallback cannot pass for NEON). */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "skn_case.h"

/* SHA-256 (FIPS 180-4), enough for the check */
typedef struct { uint32_t h[8]; uint8_t buf[64]; uint64_t len; size_t fill; } sha256_t;
static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
    0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
    0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
    0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};
#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))
static void sha_block(sha256_t *s, const uint8_t *b)
{
    uint32_t w[64], a[8];
    for (int i = 0; i < 16; i++)
        w[i] = ((uint32_t)b[4 * i] << 24) | ((uint32_t)b[4 * i + 1] << 16) | ((uint32_t)b[4 * i + 2] << 8) | b[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        const uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        const uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(a, s->h, sizeof a);
    for (int i = 0; i < 64; i++) {
        const uint32_t t1 = a[7] + (ROR(a[4], 6) ^ ROR(a[4], 11) ^ ROR(a[4], 25)) + ((a[4] & a[5]) ^ (~a[4] & a[6])) +
                            K256[i] + w[i];
        const uint32_t t2 = (ROR(a[0], 2) ^ ROR(a[0], 13) ^ ROR(a[0], 22)) + ((a[0] & a[1]) ^ (a[0] & a[2]) ^ (a[1] & a[2]));
        memmove(a + 1, a, 7 * sizeof *a);
        a[4] += t1;
        a[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++) s->h[i] += a[i];
}
static void sha_init(sha256_t *s)
{
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->len = 0;
    s->fill = 0;
}
static void sha_update(sha256_t *s, const uint8_t *p, size_t n)
{
    s->len += n;
    while (n) {
        const size_t k = 64 - s->fill < n ? 64 - s->fill : n;
        memcpy(s->buf + s->fill, p, k);
        s->fill += k; p += k; n -= k;
        if (s->fill == 64) { sha_block(s, s->buf); s->fill = 0; }
    }
}
static void sha_final(sha256_t *s, uint8_t out[32])
{
    const uint64_t bits = s->len * 8;
    uint8_t pad = 0x80, z = 0, lb[8];
    sha_update(s, &pad, 1);
    while (s->fill != 56) sha_update(s, &z, 1);
    for (int i = 0; i < 8; i++) lb[i] = (uint8_t)(bits >> (56 - 8 * i));
    sha_update(s, lb, 8);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++) out[4 * i + j] = (uint8_t)(s->h[i] >> (24 - 8 * j));
}

static uint8_t *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(len > 0 ? (size_t)len : 1);
    if (b && len > 0 && fread(b, 1, (size_t)len, f) != (size_t)len) { free(b); b = NULL; }
    fclose(f);
    *n = len > 0 ? (size_t)len : 0;
    return b;
}

int main(int argc, char **argv)
{
    const char *expect = NULL;
    int bench = 0;
    int i = 1, failed = 0, cases = 0;
    for (; i < argc && !strncmp(argv[i], "--", 2); i += 2) {
        if (i + 1 >= argc) { fprintf(stderr, "missing value for %s\n", argv[i]); return 2; }
        if (!strcmp(argv[i], "--path")) {
            if (skn_set_path(argv[i + 1]) != SKN_OK) {
                printf("path %s not available (have %s)\n", argv[i + 1], skn_paths_available());
                return 3;
            }
        } else if (!strcmp(argv[i], "--expect-path")) expect = argv[i + 1];
        else if (!strcmp(argv[i], "--bench")) bench = atoi(argv[i + 1]);
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    printf("libsakura_decode %s path: %s (available: %s)\n", skn_version(), skn_path_name(), skn_paths_available());
    for (; i < argc; i++) {
        size_t n;
        uint8_t *data = read_file(argv[i], &n);
        if (!data) { printf("FAIL %s: cannot read\n", argv[i]); failed++; continue; }
        uint32_t kind = 0;
        uint8_t want[32], got[32];
        uint16_t *out;
        size_t n_out;
        const int rc = skn_case_run(data, n, &kind, want, &out, &n_out);
        cases++;
        if (rc == SKN_OK && bench > 0) {   /* --bench N: the best of N decodes, thread CPU time */
            double best = 1e30;
            for (int r = 0; r < bench; r++) {
                struct timespec t0, t1;
                uint16_t *o2;
                size_t n2;
                clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
                skn_case_run(data, n, &kind, want, &o2, &n2);
                clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
                free(o2);
                const double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
                if (dt < best) best = dt;
            }
            printf("bench %s: %.2f ms, %.0f MB/s fp16 per core\n", argv[i], best * 1e3, (double)n_out * 2 / best / 1e6);
        }
        if (rc != SKN_OK) {
            printf("FAIL %s: %s (%d)\n", argv[i], skn_strerror(rc), rc);
            failed++;
        } else {
            sha256_t s;
            sha_init(&s);
            for (size_t k = 0; k < n_out; k++) {
                const uint8_t le[2] = {(uint8_t)(out[k] & 0xff), (uint8_t)(out[k] >> 8)};
                sha_update(&s, le, 2);
            }
            sha_final(&s, got);
            const int ok = !memcmp(got, want, 32);
            printf("%s %s\n", ok ? "ok" : "FAIL (digest differs)", argv[i]);
            failed += !ok;
        }
        free(out);
        free(data);
    }
    if (expect && strcmp(expect, skn_path_name())) {
        printf("FAIL: expected path %s, ran %s\n", expect, skn_path_name());
        return 1;
    }
    printf("%d cases, %d failed\n", cases, failed);
    return failed ? 1 : 0;
}
