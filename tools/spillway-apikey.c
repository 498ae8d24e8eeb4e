/* spillway-apikey: makes a client API key for the gateway's keys file.
 *
 *   spillway-apikey new --label L [--models a,b] [--routes p,q]
 *                       [--priority interactive|batch]
 *                       [--rps N] [--concurrency N] [--tpm N]
 *
 * Prints the key once, on the first line of stdout (it is stored nowhere:
 * give it to the client now), then a YAML entry to append under `keys:` in
 * the file given to spillway-gateway --api-keys. The entry holds only a
 * salted hash (proto/apikey.h); the gateway reloads the file on change.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "proto/apikey.h"

typedef struct {
    const char *label, *models, *routes, *priority;
    const char *rps, *concurrency, *tpm;
} opts;

static int usage(void)
{
    fprintf(stderr, "usage: spillway-apikey new --label LABEL [--models a,b] [--routes pool,pool]\n"
                    "           [--priority interactive|batch] [--rps N] [--concurrency N] [--tpm N]\n"
                    "Prints the key (once) and a YAML entry for the gateway's --api-keys file.\n");
    return 2;
}

static bool number_ok(const char *s)
{
    if (!s) return true;
    if (!*s || strlen(s) > 10) return false;
    for (const char *p = s; *p; p++)
        if (*p < '0' || *p > '9') return false;
    return strtoull(s, NULL, 10) <= 1000000000ull;
}

static bool label_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 64) return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
              strchr("-_.:@", s[i])))
            return false;
    return true;
}

static int parse_args(int argc, char **argv, opts *o)
{
    if (argc < 2 || strcmp(argv[1], "new") != 0) return -1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], **slot = NULL;
        if (!strcmp(a, "--label")) slot = &o->label;
        else if (!strcmp(a, "--models")) slot = &o->models;
        else if (!strcmp(a, "--routes") || !strcmp(a, "--pools")) slot = &o->routes;
        else if (!strcmp(a, "--priority")) slot = &o->priority;
        else if (!strcmp(a, "--rps")) slot = &o->rps;
        else if (!strcmp(a, "--concurrency")) slot = &o->concurrency;
        else if (!strcmp(a, "--tpm")) slot = &o->tpm;
        if (!slot || i + 1 >= argc) { fprintf(stderr, "spillway-apikey: bad argument '%s'\n", a); return -1; }
        *slot = argv[++i];
    }
    if (!label_ok(o->label)) { fprintf(stderr, "spillway-apikey: --label must be 1 to 64 of A-Z a-z 0-9 - _ . : @\n"); return -1; }
    if (o->priority && strcmp(o->priority, "interactive") && strcmp(o->priority, "batch")) {
        fprintf(stderr, "spillway-apikey: --priority must be interactive or batch\n");
        return -1;
    }
    if (!number_ok(o->rps) || !number_ok(o->concurrency) || !number_ok(o->tpm)) {
        fprintf(stderr, "spillway-apikey: --rps, --concurrency and --tpm take a whole number (0: no limit)\n");
        return -1;
    }
    return 0;
}

/* "a,b" as a YAML flow list of quoted names; false for an empty or odd name. */
static bool print_list(const char *field, const char *csv)
{
    if (!csv) return true;
    printf("    %s: [", field);
    const char *p = csv;
    for (int n = 0; ; n++) {
        size_t len = strcspn(p, ",");
        if (len == 0 || memchr(p, '"', len) || memchr(p, '\\', len)) return false;
        printf("%s\"%.*s\"", n ? ", " : "", (int)len, p);
        if (!p[len]) break;
        p += len + 1;
    }
    printf("]\n");
    return true;
}

int main(int argc, char **argv)
{
    opts o = {0};
    if (parse_args(argc, argv, &o) != 0) return usage();
    char key[SW_APIKEY_MAX + 1], id[SW_APIKEY_ID_MAX + 1], hash[SW_APIKEY_HASH_MAX];
    if (sw_apikey_generate(key, id) != 0 || sw_apikey_hash(key, hash) != 0) {
        fprintf(stderr, "spillway-apikey: cannot make a key (libsodium has no entropy source)\n");
        return 1;
    }
    printf("%s\n", key);
    fprintf(stderr, "spillway-apikey: the line above is the key; it is shown only now.\n"
                    "Append the lines below under 'keys:' in the gateway's --api-keys file.\n");
    printf("  - id: %s\n    label: %s\n    hash: \"%s\"\n", id, o.label, hash);
    if (!print_list("models", o.models) || !print_list("routes", o.routes)) {
        fprintf(stderr, "\nspillway-apikey: an empty or quoted name in --models/--routes\n");
        return 2;
    }
    if (o.priority) printf("    priority: %s\n", o.priority);
    if (o.rps) printf("    rps: %s\n", o.rps);
    if (o.concurrency) printf("    concurrency: %s\n", o.concurrency);
    if (o.tpm) printf("    tpm: %s\n", o.tpm);
    return 0;
}
