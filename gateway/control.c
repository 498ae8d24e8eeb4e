/* The active policy and hot reload.
 *
 * The policy pointer is swapped under policy_mu; readers take a reference
 * (sw_gw_policy) and keep using the policy they got, so a reload never
 * changes a request halfway. A file that fails to load leaves the running
 * policy in place. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <cjson/cJSON.h>
#include <sodium.h>
#include "gateway/gateway.h"
#include "gateway/metrics.h"
#include "gateway/router.h"
#include "gateway/util.h"

sw_gateway *sw_gw;

sw_policy *sw_gw_policy(sw_gateway *g)
{
    pthread_mutex_lock(&g->policy_mu);
    sw_policy *p = sw_policy_ref(g->policy);
    pthread_mutex_unlock(&g->policy_mu);
    return p;
}

static int64_t file_mtime_ns(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    return (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
}

void sw_gw_init(sw_gateway *g, sw_policy *p)
{
    g->started_ms = sw_now_ms();
    pthread_mutex_init(&g->policy_mu, NULL);
    pthread_mutex_init(&g->reload_mu, NULL);
    pthread_mutex_init(&g->inbox_mu, NULL);
    sw_registry_init(&g->reg);
    sw_metrics_init();
    g->policy = p;
    sw_metrics_set_pools(p);
}

bool sw_gw_admin_token_ok(const sw_gateway *g, const char *token)
{
    if (!g->admin_token || !token) return false;
    unsigned char want[crypto_generichash_BYTES], got[crypto_generichash_BYTES];
    crypto_generichash(want, sizeof want, (const unsigned char *)g->admin_token, strlen(g->admin_token), NULL, 0);
    crypto_generichash(got, sizeof got, (const unsigned char *)token, strlen(token), NULL, 0);
    return sodium_memcmp(want, got, sizeof want) == 0;
}

char *sw_gw_status_json(sw_gateway *g)
{
    sw_policy *p = sw_gw_policy(g);
    cJSON *o = sw_status_build(&g->reg, p, g->started_ms);
    cJSON *routes = o ? cJSON_AddArrayToObject(o, "routes") : NULL;
    if (routes) {
        pthread_mutex_lock(&g->reg.mu);
        sw_route_status(p, &g->reg, g->route_stats, routes);
        pthread_mutex_unlock(&g->reg.mu);
    }
    sw_policy_unref(p);
    pthread_mutex_lock(&g->reload_mu);
    if (o && g->last_reload_error[0]) cJSON_AddStringToObject(o, "last_reload_error", g->last_reload_error);
    else if (o) cJSON_AddNullToObject(o, "last_reload_error");
    pthread_mutex_unlock(&g->reload_mu);
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

char *sw_gw_metrics_text(sw_gateway *g)
{
    sw_policy *p = sw_gw_policy(g);
    sw_metrics_snapshot snap;
    sw_registry_snapshot(&g->reg, p, &snap);
    snap.routes = calloc(p->n_routes + 1, sizeof *snap.routes);
    if (snap.routes) {
        pthread_mutex_lock(&g->reg.mu);
        snap.n_routes = sw_route_metrics(p, g->route_stats, snap.routes, (int)p->n_routes);
        pthread_mutex_unlock(&g->reg.mu);
    }
    sw_policy_unref(p);
    char *text = sw_metrics_render(&snap);   /* no registry lock held: render takes only the metrics' */
    sw_metrics_snapshot_free(&snap);
    return text;
}

int sw_gw_reload(sw_gateway *g, char *err, size_t errlen)
{
    pthread_mutex_lock(&g->reload_mu);
    /* Record the mtime before reading: a write racing with the read then
     * shows up as a change at the next check, never as a lost update. */
    __atomic_store_n(&g->policy_mtime_ns, file_mtime_ns(g->config_path), __ATOMIC_RELEASE);
    err[0] = 0;
    sw_policy *np = sw_policy_load(g->config_path, err, errlen);
    if (!np) {
        snprintf(g->last_reload_error, sizeof g->last_reload_error, "%s", err);
        pthread_mutex_unlock(&g->reload_mu);
        sw_metrics_reload(false);
        return -1;
    }
    g->last_reload_error[0] = 0;
    pthread_mutex_lock(&g->policy_mu);
    sw_policy *old = g->policy;
    if (old && np->version <= old->version) np->version = old->version + 1;
    g->policy = np;
    pthread_mutex_unlock(&g->policy_mu);
    sw_metrics_set_pools(np);
    if (old) {
        fprintf(stderr, "gateway: policy reloaded from %s (version %llu)\n", g->config_path,
                (unsigned long long)np->version);
        sw_policy_unref(old);
    }
    pthread_mutex_unlock(&g->reload_mu);
    sw_metrics_reload(true);
    return 0;
}
