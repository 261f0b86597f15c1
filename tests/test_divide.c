/* test_divide.c: kvb_divide (kernels/common/kvb_divide.h), the multiply-high division that the kernels
 * use for a divisor fixed per launch (sparse_attn_pages' P), against C's unsigned division. The host
 * path multiplies in 64 bits where the device takes __umulhi; both give the high word of n x mul. */
#include <stdio.h>

#include "kernels/common/kvb_divide.h"
#include "reference/decode.h"
#include "tests/testlib.h"

static void expect_quotient(uint32_t d, uint32_t n)
{
    const kvb_divisor f = kvb_divisor_of(d);
    const uint32_t got = kvb_divide(&f, n), want = n / d;
    if (got != want) fail_msg("d=%u n=%u: %u, expected %u (mul=%u shift=%u)", d, n, got, want, f.mul, f.shift);
}

/* Every page size the sparse attention accepts, over the first 2^14 positions and past its largest
 * position (2^21) in strides, and at the top of the 32-bit range. */
static void test_every_page_size(void **state)
{
    (void)state;
    for (uint32_t d = 1; d <= SPARSE_MAX_P; d++) {
        for (uint32_t n = 0; n < (1u << 14); n++) expect_quotient(d, n);
        for (uint32_t n = 1u << 14; n < (1u << 22); n += 997) expect_quotient(d, n);
        for (uint32_t k = 1; k <= 3; k++) {
            expect_quotient(d, (1u << 21) * k - 1), expect_quotient(d, (1u << 21) * k);
        }
        for (uint32_t n = 0xFFFFFFFFu - 64; n != 0; n++) expect_quotient(d, n); /* up to 2^32 - 1 */
    }
}

/* Divisors at and beside every power of two, up to 2^32 - 1, at the quotients' steps (multiples of d
 * and one below them) and at the range's ends. */
static void test_powers_of_two_and_their_neighbours(void **state)
{
    (void)state;
    for (uint32_t b = 0; b < 32; b++) {
        const uint64_t p = (uint64_t)1 << b;
        const uint64_t ds[3] = {p - 1, p, p + 1};
        for (int i = 0; i < 3; i++) {
            if (ds[i] == 0 || ds[i] > 0xFFFFFFFFu) continue;
            const uint32_t d = (uint32_t)ds[i];
            for (uint64_t q = 0; q * d <= 0xFFFFFFFFu && q < 4096; q++) {
                expect_quotient(d, (uint32_t)(q * d));
                if (q * d > 0) expect_quotient(d, (uint32_t)(q * d - 1));
            }
            expect_quotient(d, 0xFFFFFFFFu), expect_quotient(d, 0x7FFFFFFFu), expect_quotient(d, 0x80000000u);
        }
    }
    expect_quotient(0xFFFFFFFFu, 0xFFFFFFFFu), expect_quotient(0xFFFFFFFFu, 0xFFFFFFFEu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_page_size),
        cmocka_unit_test(test_powers_of_two_and_their_neighbours),
    };
    return cmocka_run_group_tests_name("divide", tests, NULL, NULL);
}
