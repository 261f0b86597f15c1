/* peers.h: external peers (PyTorch, written by harness/scripts/torch_peers.py) timed on the same GPU in the
 * same round, read by `kvbench bench --peers FILE`, so that every ratio to an external peer comes
 * from one run; nothing is typed in.
 *
 * File: {"context": {...}, "peers": [{"kernel": "selective_attn", "match": {"L": 16384, ...},
 *        "peer": "torch_sdpa_cudnn_fwd", "median_us": ..., "min_us": ..., "max_us": ...,
 *        "noise_pct": ..., "samples": ...}, ...]}
 * A peer applies to a case when the kernel is the case's and every key of "match" is a key of the
 * case with that value: a number, or for an enumerated key (decode_step's method, model) its name.
 */
#ifndef KVB_PEERS_H
#define KVB_PEERS_H

#include "harness/core/case.h"

typedef struct kvb_peer {
    char kernel[64], name[64];
    char keys[16][32];
    double vals[16];
    char strs[16][32]; /* an enumerated key's name ("" for a number) */
    int n_keys;
    double median_us, min_us, max_us, noise_pct;
    int samples;
} kvb_peer;

typedef struct kvb_peers {
    kvb_peer *v;
    int n;
    char source[512]; /* the file, and its context line (torch version, device) */
} kvb_peers;

int kvb_peers_load(const char *path, kvb_peers *p); /* KVB_OK, or an error naming the file and entry */
void kvb_peers_free(kvb_peers *p);
/* The i-th peer matching case c (i from 0), or NULL past the last. */
const kvb_peer *kvb_peer_match(const kvb_peers *p, const kvb_case *c, int i);
const kvb_peer *kvb_peer_find(const kvb_peers *p, const kvb_case *c, const char *name);

#endif
