/* json.c: see json.h. */
#include "harness/core/json.h"

#include <math.h>
#include <stdlib.h>

#include "harness/core/files.h"

void kvb_format_double(char *buf, size_t n, double v)
{
    int p = 1;
    while (p < 17) { /* the fewest significant digits that read back as v */
        snprintf(buf, n, "%.*g", p, v);
        if (strtod(buf, NULL) == v) break;
        p++;
    }
    /* printed with at least 10: a value %.10g shows exactly is shown as %.10g shows it ("100", not
     * "1e+02"), more digits only where %.10g would lose some */
    snprintf(buf, n, "%.*g", p > 10 ? p : 10, v);
}

void kvb_json_put_string(FILE *f, const char *s)
{
    fputc('"', f);
    size_t n = 0;
    while (s[n]) n++;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80) { /* a valid sequence as it is; an invalid byte as the replacement character */
            size_t bad = kvb_utf8_invalid_at(s + i, n - i);
            if (bad == 0) {
                fputs("\\ufffd", f);
                i++;
                continue;
            }
            size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
            fwrite(s + i, 1, len, f);
            i += len;
            continue;
        }
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
        i++;
    }
    fputc('"', f);
}

void kvb_json_put_number(FILE *f, double v)
{
    if (!isfinite(v)) {
        fputs("null", f);
        return;
    }
    char buf[32];
    kvb_format_double(buf, sizeof buf, v);
    fputs(buf, f);
}

static void item(kvb_json *j, const char *key)
{
    if (!j->first[j->depth]) fputc(',', j->f);
    j->first[j->depth] = 0;
    fprintf(j->f, "\n%*s", 2 * j->depth, "");
    if (key) {
        kvb_json_put_string(j->f, key);
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
    kvb_json_put_string(j->f, v ? v : "");
}

void kvb_json_num(kvb_json *j, const char *key, double v)
{
    item(j, key);
    kvb_json_put_number(j->f, v);
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
