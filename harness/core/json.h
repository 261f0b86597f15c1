/* json.h: a small streaming JSON writer (objects, arrays, escaped strings, finite numbers). */
#ifndef KVB_JSON_H
#define KVB_JSON_H

#include <stdio.h>

typedef struct kvb_json {
    FILE *f;
    int depth;
    int first[32]; /* no element written yet at this depth */
    char kind[32]; /* '}' or ']': what closes this depth */
} kvb_json;

void kvb_json_begin(kvb_json *j, FILE *f);      /* opens the top-level object */
void kvb_json_end(kvb_json *j);                 /* closes it, adds a newline */
void kvb_json_obj(kvb_json *j, const char *key); /* key NULL inside arrays */
void kvb_json_arr(kvb_json *j, const char *key);
void kvb_json_close(kvb_json *j);               /* closes the innermost object or array */
void kvb_json_str(kvb_json *j, const char *key, const char *v);
void kvb_json_num(kvb_json *j, const char *key, double v); /* non-finite numbers become null */
void kvb_json_int(kvb_json *j, const char *key, long long v);
void kvb_json_bool(kvb_json *j, const char *key, int v);

#endif
