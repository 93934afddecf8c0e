/* kern.c for the neon path (aarch64 only) */
#if defined(__aarch64__)
#define SKN_PATH_NEON 1
#include "kern.c"
#endif
