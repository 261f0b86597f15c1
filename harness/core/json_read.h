/* json_read.h: a small JSON reader (the whole document into a tree), enough for the suite's own
 * result files and Google Benchmark's. Used by `compare` and by `bench --peers`. */
#ifndef KVB_JSON_READ_H
#define KVB_JSON_READ_H

typedef enum { KVB_J_NULL, KVB_J_BOOL, KVB_J_NUM, KVB_J_STR, KVB_J_ARR, KVB_J_OBJ } kvb_jtype;

typedef struct kvb_jval {
    kvb_jtype type;
    double num;              /* KVB_J_NUM, KVB_J_BOOL (0/1) */
    char *str;               /* KVB_J_STR */
    struct kvb_jval *items;  /* KVB_J_ARR elements, KVB_J_OBJ values */
    char **keys;             /* KVB_J_OBJ */
    int n;
} kvb_jval;

/* Parse a whole file. KVB_OK, or KVB_EIO / KVB_EINVAL with kvb_last_error() naming the file and, for
 * malformed text, the byte offset. An empty file is malformed. */
int kvb_json_read_file(const char *path, kvb_jval *root);
int kvb_json_read_text(const char *text, const char *what, kvb_jval *root);
void kvb_json_free(kvb_jval *v);
const kvb_jval *kvb_jget(const kvb_jval *obj, const char *key); /* NULL when absent or obj is no object */
/* convenience: the number / string at key, or dflt */
double kvb_jnum(const kvb_jval *obj, const char *key, double dflt);
const char *kvb_jstr(const kvb_jval *obj, const char *key);

#endif
