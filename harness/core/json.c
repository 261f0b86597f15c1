/* json.c: see json.h. */
#include "harness/core/json.h"

#include <math.h>

static void put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void item(kvb_json *j, const char *key)
{
    if (!j->first[j->depth]) fputc(',', j->f);
    j->first[j->depth] = 0;
    fprintf(j->f, "\n%*s", 2 * j->depth, "");
    if (key) {
        put_string(j->f, key);
        fputs(": ", j->f);
    }
}

void kvb_json_begin(kvb_json *j, FILE *f)
{
    j->f = f;
    j->depth = 1;
    j->first[1] = 1;
    j->kind[1] = '}';
    fputc('{', f);
}

void kvb_json_end(kvb_json *j)
{
    fputs("\n}\n", j->f);
    j->depth = 0;
}

static void open_(kvb_json *j, const char *key, char c)
{
    item(j, key);
    fputc(c, j->f);
    j->depth++;
    j->first[j->depth] = 1;
    j->kind[j->depth] = c == '{' ? '}' : ']';
}

void kvb_json_obj(kvb_json *j, const char *key) { open_(j, key, '{'); }
void kvb_json_arr(kvb_json *j, const char *key) { open_(j, key, '['); }

void kvb_json_close(kvb_json *j)
{
    char closer = j->kind[j->depth];
    int empty = j->first[j->depth];
    j->depth--;
    if (!empty) fprintf(j->f, "\n%*s", 2 * j->depth, "");
    fputc(closer, j->f);
}

void kvb_json_str(kvb_json *j, const char *key, const char *v)
{
    item(j, key);
    put_string(j->f, v ? v : "");
}

void kvb_json_num(kvb_json *j, const char *key, double v)
{
    item(j, key);
    if (isfinite(v)) fprintf(j->f, "%.9g", v);
    else fputs("null", j->f);
}

void kvb_json_int(kvb_json *j, const char *key, long long v)
{
    item(j, key);
    fprintf(j->f, "%lld", v);
}

void kvb_json_bool(kvb_json *j, const char *key, int v)
{
    item(j, key);
    fputs(v ? "true" : "false", j->f);
}
