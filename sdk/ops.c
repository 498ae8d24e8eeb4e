/* `spillway ops`: the operators' commands, over the gateway's admin API
 * (HTTP, with the admin token; docs/operations.md).
 *
 *   spillway ops status
 *   spillway ops drain WORKER | undrain WORKER
 *   spillway ops cordon POOL | uncordon POOL
 *   spillway ops force-overflow ROUTE on|off      ROUTE: model@pool, or a model
 *   spillway ops reload
 *
 * Options: --url URL (default $SPILLWAY_URL, else http://127.0.0.1:8080),
 * --admin-token-file FILE (default $SPILLWAY_ADMIN_TOKEN_FILE, else
 * build/run/admin.token, where `make run` writes it), --reason TEXT,
 * --as NAME (the operator named in the log; default $USER), --json (the
 * gateway's JSON as it came, for scripts).
 *
 * Exit status: 0 done, 1 the gateway refused or could not be reached, 2 a
 * usage error.
 */
#include <curl/curl.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "llm/util.h"
#include "sdk/ops.h"

typedef struct {
    const char *url, *token_file, *reason, *as;
    bool json;
    const char *words[4];
    int n_words;
} ops_args;

static void ops_usage(FILE *f)
{
    fprintf(f,
        "usage: spillway ops status\n"
        "       spillway ops drain WORKER | undrain WORKER\n"
        "       spillway ops cordon POOL | uncordon POOL\n"
        "       spillway ops force-overflow ROUTE on|off   (ROUTE: model@pool, or a model)\n"
        "       spillway ops reload\n"
        "options: --url URL (default $SPILLWAY_URL or http://127.0.0.1:8080)\n"
        "         --admin-token-file FILE (default $SPILLWAY_ADMIN_TOKEN_FILE or build/run/admin.token)\n"
        "         --reason TEXT  --as NAME (default $USER)  --json\n");
}

static int parse_ops_args(int argc, char **argv, ops_args *a)
{
    memset(a, 0, sizeof *a);
    a->url = getenv("SPILLWAY_URL") ? getenv("SPILLWAY_URL") : "http://127.0.0.1:8080";
    a->token_file = sw_cli_admin_token_file();
    a->as = getenv("USER") ? getenv("USER") : "";
    a->reason = "";
    for (int i = 2; i < argc; i++) {
        const char *s = argv[i];
        const char **val = !strcmp(s, "--url") ? &a->url : !strcmp(s, "--admin-token-file") ? &a->token_file
                           : !strcmp(s, "--reason") ? &a->reason : !strcmp(s, "--as") ? &a->as : NULL;
        if (val && i + 1 < argc) *val = argv[++i];
        else if (!strcmp(s, "--json")) a->json = true;
        else if (!strcmp(s, "-h") || !strcmp(s, "--help")) { ops_usage(stdout); exit(0); }
        else if (val || s[0] == '-' || a->n_words == 4) {
            fprintf(stderr, "spillway ops: unknown or incomplete argument '%s'\n", s);
            return -1;
        } else a->words[a->n_words++] = s;
    }
    return 0;
}

const char *sw_cli_admin_token_file(void)
{
    const char *env = getenv("SPILLWAY_ADMIN_TOKEN_FILE");
    return env && *env ? env : "build/run/admin.token";
}

char *sw_cli_read_admin_token(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "spillway: cannot read the admin token file %s (--admin-token-file FILE): %m\n", path);
        return NULL;
    }
    char buf[512];
    char *line = fgets(buf, sizeof buf, f);
    fclose(f);
    if (line) buf[strcspn(buf, "\r\n")] = 0;
    if (!line || !buf[0]) {
        fprintf(stderr, "spillway: the admin token file %s is empty\n", path);
        return NULL;
    }
    return strdup(buf);
}

static size_t collect(char *p, size_t size, size_t n, void *user)
{
    sw_sbuf_put_n(user, p, size * n);
    return size * n;
}

/* One admin request: its HTTP status and body into *out (NUL-ended), or -1
 * with the reason on stderr. */
static long call(const ops_args *a, const char *token, const char *method, const char *path,
                 const char *body, sw_sbuf *out)
{
    CURL *h = curl_easy_init();
    if (!h) return -1;
    char url[2048], auth[600];
    snprintf(url, sizeof url, "%s%s", a->url, path);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
    struct curl_slist *hdr = curl_slist_append(NULL, auth);
    hdr = curl_slist_append(hdr, "Content-Type: application/json");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 30L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    if (!strcmp(method, "POST")) curl_easy_setopt(h, CURLOPT_POSTFIELDS, body ? body : "");
    CURLcode rc = curl_easy_perform(h);
    long status = -1;
    if (rc == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    else fprintf(stderr, "spillway ops: %s: %s\n", url, curl_easy_strerror(rc));
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    sw_sbuf_put_n(out, "", 1);
    out->n--;
    return out->oom ? -1 : status;
}

static const char *str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static bool flag(const cJSON *o, const char *k)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, k));
}

/* ---- status as tables ----------------------------------------------------- */
static void print_pools(const cJSON *st)
{
    printf("%-16s %-5s %7s %6s %9s  %s\n", "POOL", "KIND", "WORKERS", "SLOTS", "INFLIGHT", "STATE");
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(st, "pools")) {
        char state[400] = "open";
        if (flag(p, "cordoned"))
            snprintf(state, sizeof state, "cordoned by %s: %s", str(p, "cordon_by"), str(p, "cordon_reason"));
        printf("%-16s %-5s %7.0f %6.0f %9.0f  %s\n", str(p, "name"), str(p, "kind"), num(p, "workers"),
               num(p, "slots"), num(p, "inflight"), state);
    }
}

static void print_workers(const cJSON *st)
{
    printf("\n%-20s %-16s %-9s %9s %6s %5s  %s\n", "WORKER", "POOL", "STATE", "INFLIGHT", "SLOTS", "KV", "NOTE");
    const cJSON *w;
    cJSON_ArrayForEach(w, cJSON_GetObjectItemCaseSensitive(st, "workers")) {
        char note[400] = "";
        if (flag(w, "drained"))
            snprintf(note, sizeof note, "drained by %s: %s", str(w, "drain_by"), str(w, "drain_reason"));
        else if (flag(w, "self_draining"))
            snprintf(note, sizeof note, "shutting down (SIGTERM)");
        printf("%-20s %-16s %-9s %9.0f %6.0f %4.0f%%  %s\n", str(w, "id"), str(w, "pool"), str(w, "state"),
               num(w, "inflight"), num(w, "slots"), 100 * num(w, "kv_utilization"), note);
    }
}

static void print_routes(const cJSON *st)
{
    printf("\n%-28s %-9s %9s %6s  %s\n", "ROUTE", "PRIORITY", "INFLIGHT", "MAX", "STATE");
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(st, "routes")) {
        char state[400] = "normal", max[16] = "-";
        if (flag(r, "forced_overflow"))
            snprintf(state, sizeof state, "forced to overflow by %s: %s", str(r, "forced_by"), str(r, "reason"));
        if (num(r, "max_concurrency") > 0) snprintf(max, sizeof max, "%.0f", num(r, "max_concurrency"));
        printf("%-28s %-9s %9.0f %6s  %s\n", str(r, "name"), flag(r, "overflow") ? "overflow" : "primary",
               num(r, "inflight"), max, state);
    }
}

static void print_actions(const cJSON *st)
{
    const cJSON *acts = cJSON_GetObjectItemCaseSensitive(st, "operator_actions");
    int n = cJSON_GetArraySize(acts);
    if (n == 0) return;
    printf("\nRECENT OPERATOR ACTIONS\n");
    for (int i = n > 10 ? n - 10 : 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(acts, i);
        time_t t = (time_t)(num(e, "at_ms") / 1000);
        char when[32];
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&t));
        printf("%s  %-18s %-24s by %s: %s\n", when, str(e, "action"), str(e, "target"), str(e, "by"),
               str(e, "reason")[0] ? str(e, "reason") : "(no reason given)");
    }
}

static void print_status(const cJSON *st)
{
    printf("policy version %.0f, up %.0f s\n", num(st, "policy_version"), num(st, "uptime_s"));
    if (str(st, "last_reload_error")[0]) printf("last reload FAILED: %s\n", str(st, "last_reload_error"));
    printf("\n");
    print_pools(st);
    print_workers(st);
    print_routes(st);
    print_actions(st);
}

/* ---- the commands --------------------------------------------------------- */
/* The request a command makes: method, path and body (caller frees both). */
static int build_request(const ops_args *a, const char **method, char **path, char **body)
{
    const char *verb = a->n_words ? a->words[0] : "";
    static const struct { const char *verb, *base; int args; } V[] = {
        {"status", NULL, 1}, {"reload", NULL, 1}, {"drain", "/admin/workers/", 2}, {"undrain", "/admin/workers/", 2},
        {"cordon", "/admin/pools/", 2}, {"uncordon", "/admin/pools/", 2}, {"force-overflow", "/admin/routes/", 3},
    };
    for (size_t i = 0; i < sizeof V / sizeof V[0]; i++) {
        if (strcmp(verb, V[i].verb)) continue;
        bool onoff = V[i].args == 3 && (!strcmp(a->words[a->n_words - 1], "on") || !strcmp(a->words[a->n_words - 1], "off"));
        if (a->n_words != V[i].args || (V[i].args == 3 && !onoff)) return -1;
        *method = i == 0 ? "GET" : "POST";
        *path = NULL;
        *body = NULL;
        if (i < 2) return (*path = strdup(i == 0 ? "/admin/status" : "/admin/reload")) ? 0 : -1;
        char *esc = curl_easy_escape(NULL, a->words[1], 0);
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "reason", a->reason);
        if (a->as[0]) cJSON_AddStringToObject(b, "operator", a->as);
        if (V[i].args == 3) cJSON_AddBoolToObject(b, "on", !strcmp(a->words[2], "on"));
        *body = cJSON_PrintUnformatted(b);
        cJSON_Delete(b);
        const char *tail = V[i].args == 3 ? "force-overflow" : V[i].verb;
        if (!esc || asprintf(path, "%s%s/%s", V[i].base, esc, tail) < 0) *path = NULL;
        curl_free(esc);
        return *path && *body ? 0 : -1;
    }
    return -1;
}

/* What the gateway said, for a person: the status tables, an action's
 * result in a line, or the error's message. */
static int report(const ops_args *a, long status, const char *resp)
{
    cJSON *o = cJSON_Parse(resp);
    if (status != 200) {
        const cJSON *err = cJSON_GetObjectItemCaseSensitive(o, "error");
        fprintf(stderr, "spillway ops: the gateway answered %ld: %s\n", status,
                err ? str(err, "message") : resp);
    } else if (a->json) {
        printf("%s\n", resp);
    } else if (!strcmp(a->words[0], "status")) {
        print_status(o);
    } else if (!strcmp(a->words[0], "reload")) {
        printf("policy reloaded: version %.0f\n", num(o, "version"));
    } else {
        printf("%s %s", str(o, "action"), a->words[1]);
        if (str(o, "state")[0]) printf(": now %s, %.0f in flight", str(o, "state"), num(o, "inflight"));
        printf("\n");
        if (str(o, "warning")[0]) fprintf(stderr, "warning: %s\n", str(o, "warning"));
    }
    if (status != 200 && a->json) printf("%s\n", resp);
    cJSON_Delete(o);
    return status == 200 ? 0 : 1;
}

int sw_cli_ops(int argc, char **argv)
{
    ops_args a;
    const char *method;
    char *path = NULL, *body = NULL;
    if (parse_ops_args(argc, argv, &a) != 0 || build_request(&a, &method, &path, &body) != 0) {
        if (!a.n_words || a.n_words <= 4) ops_usage(stderr);
        free(path);
        free(body);
        return 2;
    }
    char *token = sw_cli_read_admin_token(a.token_file);
    int rc = 1;
    if (token && curl_global_init(CURL_GLOBAL_DEFAULT) == 0) {
        sw_sbuf resp = {0};
        long status = call(&a, token, method, path, body, &resp);
        if (status > 0) rc = report(&a, status, resp.s ? resp.s : "");
        sw_sbuf_free(&resp);
        curl_global_cleanup();
    }
    free(token);
    free(path);
    free(body);
    return rc;
}
