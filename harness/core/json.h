/* json.h: a small streaming JSON writer (objects, arrays, escaped strings, finite numbers). */
#ifndef KVB_JSON_H
#define KVB_JSON_H

#include <stddef.h>
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

/* A JSON string: '"' and '\\' escaped, control characters as \n, \t or \u00XX, valid UTF-8 as it is,
 * and a byte that is not part of valid UTF-8 as \ufffd (the output is always valid JSON). */
void kvb_json_put_string(FILE *f, const char *s);
/* A JSON number in its shortest exact form; null when not finite. */
void kvb_json_put_number(FILE *f, double v);
/* v exactly: "%.<p>g" with p the fewest significant digits (1..17) that read back (strtod) as v, but at
 * least 10, so that a value "%.10g" shows exactly prints as before ("100", "0.6", "1e-05") and only a
 * value it would round gets more digits. Two different doubles never print alike, and what is printed
 * parses to the same value. */
void kvb_format_double(char *buf, size_t n, double v);

#endif
