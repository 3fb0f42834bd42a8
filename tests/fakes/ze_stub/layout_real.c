/* Prints sizeof/offsetof of every struct and field in layout_table.h as the real Level
 * Zero header lays them out (Debian/Ubuntu libze-dev: <level_zero/zes_api.h>). The test
 * compares this with ctypes, so the exporter's declarations are proven against the
 * spec's own header, not only against the stub's transcription of it. */
#include <stddef.h>
#include <stdio.h>

#include <level_zero/zes_api.h>

#include "layout_table.h"

int main(void) {
#define STRUCT(S) printf(#S " - %zu\n", sizeof(S));
#define FIELD(S, F) printf(#S " " #F " %zu\n", offsetof(S, F));
    ZE_LAYOUT_TABLE(STRUCT, FIELD)
    return 0;
}
