/* case.h: cases as data. A case is one line `kernel key=value ...` (README.md, "Cases").
 *
 * Each kernel declares its keys (kvb_param) in order; that order is the canonical order of the case
 * id. The id holds every key of the kernel with its value (defaults filled in), so two spellings of
 * one case have one id. `tier` and the tolerance keys (atol, rtol, l2) are not part of the id: they
 * say how a case is run and judged, not what it computes.
 */
#ifndef KVB_CASE_H
#define KVB_CASE_H

#include <stddef.h>
#include <stdint.h>

#define KVB_MAX_PARAMS 32
#define KVB_ID_MAX 512

typedef enum { KVB_P_INT, KVB_P_FLOAT, KVB_P_ENUM } kvb_ptype;

typedef struct kvb_param {
    const char *name;
    kvb_ptype type;
    double def;          /* default (for enums: index into `choices`) */
    double lo, hi;       /* allowed range, inclusive (ints and floats) */
    const char *choices; /* enums: "a|b|c"; ints: the only values allowed in [lo, hi], "64|128" (NULL: any) */
    const char *help;
} kvb_param;

/* sanitize: small cases, one or more per kernel and impl, for compute-sanitizer (make sanitize) */
typedef enum { KVB_TIER_SMOKE = 1, KVB_TIER_CHECK = 2, KVB_TIER_BENCH = 4, KVB_TIER_SANITIZE = 8 } kvb_tier;
#define KVB_TIER_ALL (KVB_TIER_SMOKE | KVB_TIER_CHECK | KVB_TIER_BENCH | KVB_TIER_SANITIZE)

struct kvb_op;

typedef struct kvb_case {
    const struct kvb_op *op;
    double v[KVB_MAX_PARAMS]; /* one value per op param, in declaration order */
    int tier;                 /* one of kvb_tier; 0 when the line gave none */
    double atol, rtol, l2;    /* < 0: the op's default */
    char id[KVB_ID_MAX];
    char where[160];          /* "cases/x.cases:12" or "command line" */
} kvb_case;

/* Parse one case line. Returns 0, or KVB_EINVAL with kvb_last_error() naming the problem
 * (prefixed with `where`). A blank or comment-only line returns KVB_CASE_BLANK and leaves *c
 * untouched. */
#define KVB_CASE_BLANK (-1)
int kvb_case_parse(const char *line, const char *where, kvb_case *c);

/* Value of a key by name (aborts on a name the op does not declare: a programming error). */
double kvb_case_get(const kvb_case *c, const char *name);
static inline int kvb_case_int(const kvb_case *c, const char *name) { return (int)kvb_case_get(c, name); }
static inline int64_t kvb_case_i64(const kvb_case *c, const char *name) { return (int64_t)kvb_case_get(c, name); }
const char *kvb_case_enum(const kvb_case *c, const char *name); /* the chosen enum string */

/* A list of cases, loaded from files and the command line, indexed by id. */
typedef struct kvb_case_list {
    kvb_case *v;
    int n, cap;
    int *slot;  /* open-addressing hash of the ids: index into v, or -1 */
    int n_slot; /* a power of two, at least twice n */
} kvb_case_list;

/* Load every `*.cases` file of a directory (sorted by name, however many), or a single file (any
 * readable file: a pipe, /dev/stdin). Any error stops the load and returns KVB_EINVAL: a suite with a
 * malformed case line runs nothing. Lines end at LF, CRLF or a lone CR; a line that is not valid UTF-8
 * is refused. The same id twice in the suite (within a file or across files) is refused, naming
 * both lines: which tier or tolerance was meant is not known. */
int kvb_cases_load(kvb_case_list *list, const char *path);
/* Parse text holding case lines, one a line (the contents of a case file; `name` names it in
 * messages as name:line). Errors as kvb_cases_load. */
int kvb_cases_parse_text(kvb_case_list *list, const char *text, const char *name);
/* The line at `line`: its length without its end (LF, CRLF or a lone CR) in *len; returns where the next
 * line starts (the text's NUL after the last). */
const char *kvb_line_next(const char *line, size_t *len);
int kvb_cases_add(kvb_case_list *list, const kvb_case *c);
int kvb_cases_find(const kvb_case_list *list, const char *id); /* the index of the case with this id, or -1 */
void kvb_cases_free(kvb_case_list *list);

const char *kvb_tier_name(int tier);
void kvb_list_kernels(char *buf, size_t n); /* "index_scan, gather_copy, ...": every kernel's name */
/* A key's allowed values as text: "a|b|c" for an enum (an impl key's from the op's impl table), "{64, 128}"
 * for an int key with choices, else "[lo, hi]" in the case line's own number form. */
/* "method=rocketkv|omnikv" when p is read only with those values of another key (kvb_op.scopes), else NULL */
const char *kvb_param_only_with(const struct kvb_op *op, const kvb_param *p);
void kvb_param_range_text(const struct kvb_op *op, const kvb_param *p, char *buf, size_t n);
/* A value of the key as a case line spells it (an enum's choice, a float's shortest exact form). */
void kvb_param_value_text(const struct kvb_op *op, const kvb_param *p, double v, char *buf, size_t n);
int kvb_tier_parse(const char *s); /* 0 when unknown */

#endif
