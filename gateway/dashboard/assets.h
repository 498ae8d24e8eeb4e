/* The dashboard's files (index.html, app.js, style.css), embedded in the
 * gateway at build time by gateway/dashboard/embed.sh (the Makefile runs it).
 * The table is read-only and lives as long as the program. */
#ifndef SW_DASHBOARD_ASSETS_H
#define SW_DASHBOARD_ASSETS_H
#include <stddef.h>

typedef struct {
    const char *name;            /* the file's base name, e.g. "app.js" */
    const unsigned char *data;   /* its bytes (not NUL-terminated) */
    size_t len;
} sw_dash_file;

extern const sw_dash_file sw_dash_files[];
extern const unsigned sw_dash_n_files;

#endif
