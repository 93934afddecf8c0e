/* kern.c for the portable scalar path */
#define SKN_PATH_SCALAR 1
#include "kern.c"
