/* json_read.h: a small JSON reader (the whole document into a tree), enough for the suite's own
 * result files and Google Benchmark's. Used by `compare` and by `bench --peers`.
 *
 * Strict RFC 8259: numbers as JSON writes them (no NaN, Infinity, hex, leading '+' or zeros, no '.5'
 * or '5.'; a finite double), strings of valid UTF-8 with the JSON escapes (\u escapes decoded to
 * UTF-8, surrogate pairs joined), no duplicate keys in an object, nothing after the document. The
 * one exception is asked for by flag: Google Benchmark writes a non-finite double as a bare NaN,
 * -NaN, Infinity or -Infinity (the coefficient of variation of a counter that is zero, with
 * --benchmark_repetitions), so its files are read with KVB_JSON_NONFINITE; such values read as NaN
 * or +-inf, and a caller checks every number it uses.
 */
#ifndef KVB_JSON_READ_H
#define KVB_JSON_READ_H

#include <stdio.h>

typedef enum { KVB_J_NULL, KVB_J_BOOL, KVB_J_NUM, KVB_J_STR, KVB_J_ARR, KVB_J_OBJ } kvb_jtype;

typedef struct kvb_jval {
    kvb_jtype type;
    double num;              /* KVB_J_NUM, KVB_J_BOOL (0/1) */
    char *str;               /* KVB_J_STR */
    struct kvb_jval *items;  /* KVB_J_ARR elements, KVB_J_OBJ values */
    char **keys;             /* KVB_J_OBJ */
    int n;
} kvb_jval;

#define KVB_JSON_NONFINITE 1 /* accept Google Benchmark's NaN, -NaN, Infinity, -Infinity */

/* Parse a whole file (any readable file: a pipe, /dev/stdin; not a directory). KVB_OK, or KVB_EIO /
 * KVB_EINVAL with kvb_last_error() naming the file and, for malformed text, the byte offset, line,
 * column and what was expected. An empty file is malformed. */
int kvb_json_read_file(const char *path, kvb_jval *root);
int kvb_json_read_file_flags(const char *path, kvb_jval *root, int flags);
int kvb_json_read_text(const char *text, const char *what, kvb_jval *root);
int kvb_json_read_text_flags(const char *text, const char *what, kvb_jval *root, int flags);
void kvb_json_free(kvb_jval *v);
const kvb_jval *kvb_jget(const kvb_jval *obj, const char *key); /* NULL when absent or obj is no object */
/* convenience: the number / string at key, or dflt */
double kvb_jnum(const kvb_jval *obj, const char *key, double dflt);
const char *kvb_jstr(const kvb_jval *obj, const char *key);
/* Write a tree back as JSON (indented; numbers in their shortest exact form; a non-finite number as
 * Google Benchmark writes it, so a file read with KVB_JSON_NONFINITE is written as it was read). */
void kvb_json_write_tree(FILE *f, const kvb_jval *v);

#endif
