/* Per-request accounting: the latency histograms (metrics.h's
 * sw_metrics_observe), the request's cost and the access log.
 *
 * The broker calls these at a request's dispatch, at each chunk and at its
 * end, on the broker thread (the fields they keep in sw_req are the
 * broker's). The access log is one line per request the broker finished,
 * on stderr:
 *   access: id=.. route=MODEL@POOL pool=.. model=.. status=ok|error|cancelled|rejected
 *           prompt_tokens=N completion_tokens=N ttft_s=S duration_s=S worker_s=S cost_usd=D key=LABEL
 * key is the client key's label (keys.h), never its secret; "-" without keys.
 *
 * Layer: beside the broker; uses metrics.h, req.h and the policy.
 */
#ifndef SW_GW_ACCESS_H
#define SW_GW_ACCESS_H

#include <stdint.h>
#include "gateway/metrics.h"
#include "gateway/req.h"

/* r was handed to a worker of pool: the first time, its queue wait
 * (arrival to now). */
void sw_access_dispatched(sw_req *r, const char *pool, int64_t now_ns);
/* A chunk of r arrived at now_ns: its first token's time to first token,
 * later ones' inter-token gaps (a gap before n tokens counts n times 1/n). */
void sw_access_chunk(sw_req *r, const Spillway__TokenChunk *c, int64_t now_ns);
/* r ends with status st: its duration (if it was dispatched), its worker
 * time and cost (its pool's cost_per_hour in r->policy) and its log line. */
void sw_access_end(sw_req *r, sw_status_label st, int64_t now_ns);
/* A worker's claim of worker seconds, bounded: finite, 0 to a day. */
double sw_access_worker_seconds(double claimed);

#endif
