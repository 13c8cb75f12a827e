/* test_util.c -- buf, err, alloc, sha1, md5 and base64. */
#include <check.h>
#include <string.h>

#include "util/alloc.h"
#include "util/base64.h"
#include "util/buf.h"
#include "util/err.h"
#include "util/md5.h"
#include "util/sha1.h"

START_TEST(test_buf_grow)
{
    struct buf b;
    buf_init(&b);
    for (int i = 0; i < 1000; i++)
        ck_assert_int_eq(buf_printf(&b, "%d,", i), 0);
    ck_assert(strncmp(b.data, "0,1,2,", 6) == 0);
    buf_consume(&b, 2);
    ck_assert(strncmp(b.data, "1,2,", 4) == 0);
    buf_release(&b);
}
END_TEST

START_TEST(test_buf_limit)
{
    struct buf b;
    buf_init(&b);
    b.max_bytes = 4;
    ck_assert_int_eq(buf_puts(&b, "abcd"), 0);
    ck_assert_int_eq(buf_puts(&b, "e"), CR_ETOOBIG);
    ck_assert_str_eq(b.data, "abcd");
    buf_release(&b);
}
END_TEST

START_TEST(test_buf_oom)
{
    struct buf b;
    buf_init(&b);
    cr_alloc_fail_after(1);
    ck_assert_int_eq(buf_puts(&b, "x"), CR_ENOMEM);
    ck_assert_int_eq(cr_alloc_failed(), 1);
    ck_assert_int_eq(buf_puts(&b, "x"), 0);
    buf_release(&b);
}
END_TEST

/* buf_printf formats into the room a buffer has when the text fits, and
 * grows it when not: both ways give the same text, and a text past the limit
 * or past the room leaves the buffer as it was (NUL-terminated). */
START_TEST(test_buf_printf_room)
{
    struct buf b;
    char big[300];
    buf_init(&b);
    ck_assert_int_eq(buf_reserve(&b, 40), 0);
    ck_assert_int_eq(buf_printf(&b, "%s-%d", "ab", 12), 0); /* fits the room */
    ck_assert_str_eq(b.data, "ab-12");
    ck_assert_uint_eq(b.len, 5);
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    ck_assert_uint_lt(b.cap - b.len, sizeof(big)); /* does not fit: grows */
    ck_assert_int_eq(buf_printf(&b, "[%s]", big), 0);
    ck_assert_uint_eq(b.len, 5 + sizeof(big) + 1);
    ck_assert(strncmp(b.data, "ab-12[xxx", 9) == 0);
    ck_assert_int_eq(b.data[b.len - 1], ']');
    ck_assert_int_eq(b.data[b.len], '\0');
    buf_release(&b);

    /* within the room but past max_bytes: refused, the room's bytes cleared */
    buf_init(&b);
    ck_assert_int_eq(buf_reserve(&b, 60), 0);
    b.max_bytes = 8;
    ck_assert_int_eq(buf_printf(&b, "%s", "abcd"), 0);
    ck_assert_int_eq(buf_printf(&b, "%s", "efghij"), CR_ETOOBIG);
    ck_assert_str_eq(b.data, "abcd");
    ck_assert_uint_eq(b.len, 4);
    ck_assert_int_eq(buf_printf(&b, "%d", 5678), 0);
    ck_assert_str_eq(b.data, "abcd5678");
    buf_release(&b);

    /* past the room, growing refused: the cut text written into the room
     * is taken back */
    buf_init(&b);
    ck_assert_int_eq(buf_puts(&b, "ok"), 0);
    cr_alloc_fail_after(1);
    ck_assert_int_eq(buf_printf(&b, "%s", big), CR_ENOMEM);
    ck_assert_str_eq(b.data, "ok");
    ck_assert_uint_eq(b.len, 2);
    buf_release(&b);
}
END_TEST

START_TEST(test_err)
{
    struct cr_err e;
    ck_assert_int_eq(cr_err_set(&e, CR_EPROTO, "bad id '%s'", "x"), CR_EPROTO);
    ck_assert_str_eq(e.msg, "bad id 'x'");
    ck_assert_str_eq(cr_strerror(CR_ENOMEM), "out of memory");
    ck_assert_int_eq(cr_err_set(NULL, CR_EIO, "x"), CR_EIO);
}
END_TEST

START_TEST(test_sha1)
{
    /* FIPS 180 examples, then every padding boundary (55/56, 63/64/65 and
     * 119/120 bytes), against Python's hashlib. */
    static const struct {
        size_t n;
        const char *hex;
    } lens[] = {
        {55, "ddf57317ef34bfee3b6df83d359098930eb278bc"},
        {56, "a0d492bb0fc889d0eca3bc137066ab6f4f74f369"},
        {63, "c55856749bef509bdfe6bfebfc7bf4e793e82132"},
        {64, "bede92be29c3874e1b54ddc77988d606fc857a8e"},
        {65, "b05a80522b053d6dc7e0a517d0e70212c7dad11f"},
        {119, "504e27376a6e0f0dba8295b85cb25dc4dfa17d23"},
        {120, "82134b02fb3f702491be9bed581eeab59334acb2"},
    };
    static const char abc56[] =
        "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    unsigned char data[128];
    char hex[SHA1_HEX_LEN + 1];
    static char million[1000000];

    sha1_hex("", 0, hex);
    ck_assert_str_eq(hex, "da39a3ee5e6b4b0d3255bfef95601890afd80709");
    sha1_hex("abc", 3, hex);
    ck_assert_str_eq(hex, "a9993e364706816aba3e25717850c26c9cd0d89d");
    sha1_hex(abc56, sizeof(abc56) - 1, hex);
    ck_assert_str_eq(hex, "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
    memset(million, 'a', sizeof(million));
    sha1_hex(million, sizeof(million), hex);
    ck_assert_str_eq(hex, "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (unsigned char)((i * 7 + 3) & 255);
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        sha1_hex(data, lens[i].n, hex);
        ck_assert_msg(!strcmp(hex, lens[i].hex), "%zu bytes: %s", lens[i].n, hex);
    }
}
END_TEST

START_TEST(test_md5)
{
    /* RFC 1321's suite, then every padding boundary (55/56, 63/64/65 and
     * 119/120 bytes), against Python's hashlib. */
    static const struct {
        const char *in, *hex;
    } rfc[] = {
        {"", "d41d8cd98f00b204e9800998ecf8427e"},
        {"a", "0cc175b9c0f1b6a831c399e269772661"},
        {"abc", "900150983cd24fb0d6963f7d28e17f72"},
        {"message digest", "f96b697d7cb7938d525a2f31aaf161d0"},
        {"abcdefghijklmnopqrstuvwxyz", "c3fcd3d76192e4007dfb496cca67e13b"},
        {"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
         "d174ab98d277d9f5a5611c2c9f419d9f"},
        {"1234567890123456789012345678901234567890123456789012345678901234567890"
         "1234567890",
         "57edf4a22be3c955ac49da2e2107b67a"},
    };
    static const struct {
        size_t n;
        const char *hex;
    } lens[] = {
        {55, "52c0e574e1198de5fe3f8f11440dcb1b"},
        {56, "46c9907fc908ee68b1e7b8e71286a518"},
        {63, "a62f6d59e837867693f042f5b8f5a236"},
        {64, "7160b8fb5e9e4023d549c3971fbaeead"},
        {65, "70bd662e7aefbda85a0f7244167b7897"},
        {119, "e84905d4214f4d1ca56c2cdcc152b143"},
        {120, "e3eb5a6c8669ea01a8c185b8abc8a5dc"},
    };
    unsigned char data[128];
    char hex[MD5_HEX_LEN + 1];
    static char million[1000000];

    for (size_t i = 0; i < sizeof(rfc) / sizeof(rfc[0]); i++) {
        md5_hex(rfc[i].in, strlen(rfc[i].in), hex);
        ck_assert_msg(!strcmp(hex, rfc[i].hex), "'%s': %s", rfc[i].in, hex);
    }
    memset(million, 'a', sizeof(million));
    md5_hex(million, sizeof(million), hex);
    ck_assert_str_eq(hex, "7707d6ae4e027c70eea2a935c2296f21");
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (unsigned char)((i * 7 + 3) & 255);
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        md5_hex(data, lens[i].n, hex);
        ck_assert_msg(!strcmp(hex, lens[i].hex), "%zu bytes: %s", lens[i].n, hex);
    }
}
END_TEST

/* Every length 0..40 round-trips, as RFC 4648's vectors; each mode refuses
 * what the other allows. */
START_TEST(test_base64)
{
    static const char *const rfc[][2] = {{"", ""},
                                         {"f", "Zg=="},
                                         {"fo", "Zm8="},
                                         {"foo", "Zm9v"},
                                         {"foob", "Zm9vYg=="},
                                         {"fooba", "Zm9vYmE="},
                                         {"foobar", "Zm9vYmFy"}};
    unsigned char bin[64], out[64];
    struct buf b;
    for (size_t i = 0; i < sizeof(rfc) / sizeof(rfc[0]); i++) {
        buf_init(&b);
        ck_assert_int_eq(base64_encode(rfc[i][0], strlen(rfc[i][0]), &b), 0);
        ck_assert_str_eq(b.data ? b.data : "", rfc[i][1]);
        buf_release(&b);
    }
    for (size_t n = 0; n <= 40; n++) {
        for (size_t k = 0; k < n; k++)
            bin[k] = (unsigned char)(k * 37 + n * 11 + 250);
        buf_init(&b);
        ck_assert_int_eq(base64_encode(bin, n, &b), 0);
        ck_assert_int_eq(base64_decode(b.data ? b.data : "", b.len, out, BASE64_STRICT),
                         (long)n);
        ck_assert(memcmp(bin, out, n) == 0);
        buf_release(&b);
    }
    ck_assert_int_eq(base64_decode("Zg", 2, out, BASE64_STRICT), -1); /* unpadded */
    ck_assert_int_eq(base64_decode("Zg", 2, out, 0), 1);
    ck_assert_int_eq(base64_decode("-_8=", 4, out, BASE64_STRICT), -1); /* URL-safe */
    ck_assert_int_eq(base64_decode("-_8=", 4, out, 0), 2);
    ck_assert_int_eq(out[0], 0xfb);
    ck_assert_int_eq(base64_decode("Z=g=", 4, out, 0), -1); /* '=' inside */
    ck_assert_int_eq(base64_decode("Z===", 4, out, BASE64_STRICT), -1);
    ck_assert_int_eq(base64_decode("Zm9vY", 5, out, 0), -1); /* 4k + 1 */
    ck_assert_int_eq(base64_decode("Zm 9", 4, out, 0), -1);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("util");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_buf_grow);
    tcase_add_test(tc, test_buf_limit);
    tcase_add_test(tc, test_buf_oom);
    tcase_add_test(tc, test_buf_printf_room);
    tcase_add_test(tc, test_err);
    tcase_add_test(tc, test_sha1);
    tcase_add_test(tc, test_md5);
    tcase_add_test(tc, test_base64);
    suite_add_tcase(s, tc);
    return s;
}
