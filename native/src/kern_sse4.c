/* kern.c for the sse4 path (x86-64 only; compiled with its own target flags, see setup.py / Makefile) */
#if defined(__x86_64__) || defined(_M_X64)
#define SKN_PATH_SSE4 1
#include "kern.c"
#endif
