/* libFuzzer target over libsakura_decode's entry points, built with AddressSanitizer and
 * UndefinedBehaviorSanitizer (`make -C native fuzz`, clang). An input is a case file
 * (tests/skn_case.h): the header numbers, tables and payload bytes of a progressive ladder (start
 * and every upgrade), a CacheGen object or a lossless one, so mutations reach every parser and
 * kernel of the library. The library must return a status for any of them: a crash, an
 * out-of-bounds access, a leak or undefined behaviour is a finding. Outputs are capped at 2^20
 * values (CASE_MAX_VALUES) to keep executions fast. */
#define CASE_MAX_VALUES ((uint64_t)1 << 20)
#include "../tests/skn_case.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint32_t kind;
    uint8_t sha[32];
    uint16_t *out = NULL;
    size_t n_out = 0;
    const int rc = skn_case_run(data, size, &kind, sha, &out, &n_out);
    if (rc == SKN_OK && n_out) {   /* touch the output: every value must be written */
        volatile uint16_t acc = 0;
        for (size_t i = 0; i < n_out; i++) acc ^= out[i];
        (void)acc;
    }
    free(out);
    (void)skn_strerror(rc);
    return 0;
}
