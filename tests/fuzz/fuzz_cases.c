/* fuzz_cases.c: libFuzzer target for the case parser and the ops' shape checks.
 *
 * The input is parsed as one case line (a FILTER on the command line) and as the text of a case
 * file. Each case that parses has been through its op's validate step (kvb_case_parse calls it); it
 * then goes through what `kvbench list` does with it and its host pool size is computed. Nothing is
 * set up: no tensor is allocated, no reference runs, nothing is launched.
 *
 * Properties beyond "no crash, hang, leak or UB": a refusal says why, and a case's id is a case line
 * that parses back to the same id (case.h).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/core/cli.h"

static void require(int ok, const char *what, const char *text)
{
    if (ok) return;
    fprintf(stderr, "fuzz_cases: %s: %s\n  last error: %s\n", what, text, kvb_last_error());
    abort(); /* a finding: libFuzzer saves the input */
}

static void exercise(const kvb_case *c)
{
    char line[KVB_ID_MAX + 128];
    kvb_case_repro(c, line, sizeof line); /* what `kvbench list` prints */
    (void)kvb_tier_name(c->tier);
    for (int i = 0; i < c->op->n_params; i++)
        if (c->op->params[i].type == KVB_P_ENUM) (void)kvb_case_enum(c, c->op->params[i].name);
    kvb_case again;
    require(kvb_case_parse(c->id, "id", &again) == KVB_OK, "the id does not parse", c->id);
    require(!strcmp(again.id, c->id), "the id parses to another id", c->id);
    /* the pinned pool `check` reserves: computed here, never allocated */
    if (c->op->host_pool_bytes) (void)c->op->host_pool_bytes(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0'; /* bytes after a NUL are not seen, as in a C string argument */

    kvb_clear_error();
    kvb_case c;
    (void)kvb_is_case_line(text);
    int rc = kvb_case_parse(text, "fuzz", &c);
    if (rc == KVB_OK) exercise(&c);
    else if (rc != KVB_CASE_BLANK) require(kvb_last_error()[0] != '\0', "a refusal without a message", text);

    kvb_case_list list = {0};
    kvb_clear_error();
    rc = kvb_cases_parse_text(&list, text, "fuzz.cases");
    if (rc != KVB_OK) require(kvb_last_error()[0] != '\0', "a refusal without a message", text);
    for (int i = 0; i < list.n; i++) exercise(&list.v[i]);
    kvb_cases_free(&list);
    free(text);
    return 0;
}
