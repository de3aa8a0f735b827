/* CUnit suite: the --auth-file parser and its lookups (gateway/core/mg_auth.c). */
#include "mg_auth.h"
#include "mg_test.h"

#include <stdio.h>
#include <string.h>

/* sha256("tok-a") */
#define HASH_A "sha256:4f66a4283f8bc9768c3cb97fd06d267b79315aee941c9c1727b9354509242ffe"

static mg_auth *parse(const char *text, char *err)
{
    return mg_auth_parse(text, strlen(text), err, 256);
}

static void hash_hex(const char *tok, char out[80])
{
    uint8_t h[MG_AUTH_HASH_LEN];
    mg_auth_hash(tok, strlen(tok), h);
    strcpy(out, "sha256:");
    for (int i = 0; i < MG_AUTH_HASH_LEN; i++)
        sprintf(out + 7 + 2 * i, "%02x", h[i]);
}

static void test_lookups(void)
{
    char ha[80], hb[80], text[512], err[256];
    uint8_t h[MG_AUTH_HASH_LEN];
    mg_principal p;
    mg_auth *a;
    hash_hex("tok-a", ha);
    hash_hex("tok-b", hb);
    snprintf(text, sizeof(text),
             "# principals\r\n"
             "\n"
             "token %s team-a\n"
             "  token\t%s   ops   admin  # trailing comment\n"
             "cert spiffe://c/ns/a team-a user\n"
             "cert dev-client team-c\n"
             "uid 1000 team-u",
             ha, hb);
    a = parse(text, err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    CU_ASSERT_EQUAL(mg_auth_count(a), 5);
    mg_auth_hash("tok-a", 5, h);
    CU_ASSERT_EQUAL(mg_auth_by_token(a, h, &p), 0);
    CU_ASSERT_STRING_EQUAL(p.tenant, "team-a");
    CU_ASSERT_EQUAL(p.admin, 0);
    CU_ASSERT_STRING_EQUAL(p.how, "token");
    mg_auth_hash("tok-b", 5, h);
    CU_ASSERT_EQUAL(mg_auth_by_token(a, h, &p), 0);
    CU_ASSERT_STRING_EQUAL(p.tenant, "ops");
    CU_ASSERT_EQUAL(p.admin, 1);
    mg_auth_hash("tok-c", 5, h);
    CU_ASSERT_EQUAL(mg_auth_by_token(a, h, &p), -1);
    /* the first listed name of a certificate wins; names are whole, not prefixes */
    CU_ASSERT_EQUAL(mg_auth_by_cert(a, "other\nspiffe://c/ns/a\ndev-client\n", &p), 0);
    CU_ASSERT_STRING_EQUAL(p.tenant, "team-a");
    CU_ASSERT_EQUAL(mg_auth_by_cert(a, "dev-client\n", &p), 0);
    CU_ASSERT_STRING_EQUAL(p.tenant, "team-c");
    CU_ASSERT_EQUAL(mg_auth_by_cert(a, "dev-clien\ndev-client-b\n", &p), -1);
    CU_ASSERT_EQUAL(mg_auth_by_cert(a, "", &p), -1);
    CU_ASSERT_EQUAL(mg_auth_by_uid(a, 1000, &p), 0);
    CU_ASSERT_STRING_EQUAL(p.tenant, "team-u");
    CU_ASSERT_EQUAL(mg_auth_by_uid(a, 0, &p), -1);
    mg_auth_free(a);
    /* no table: nothing is known */
    CU_ASSERT_EQUAL(mg_auth_by_token(NULL, h, &p), -1);
    CU_ASSERT_EQUAL(mg_auth_by_uid(NULL, 0, &p), -1);
    CU_ASSERT_EQUAL(mg_auth_count(NULL), 0);
}

static void test_errors_name_the_line(void)
{
    static const struct {
        const char *text, *err;
    } bad[] = {
        {"token abc t\n", "line 1: a token is given as sha256:"},
        {"token " HASH_A "x t\n", "line 1: a token is given as sha256:"},
        {"token sha256:zz66a4283f8bc9768c3cb97fd06d267b79315aee941c9c1727b9354509242ffe t\n",
         "line 1: the token hash is not hexadecimal"},
        {"\n# c\ncert x\n", "line 3: expected"},
        {"cert x t root\n", "line 1: role \"root\""},
        {"cert x t admin more\n", "line 1: unexpected \"more\""},
        {"cert x a/b\n", "line 1: tenant \"a/b\""},
        {"uid -1 t\n", "line 1: uid \"-1\""},
        {"uid 99999999999 t\n", "line 1: uid"},
        {"key x t\n", "line 1: kind \"key\""},
        {"uid 5 t\nuid 5 u\n", "line 2: the same credential"},
        {"cert x t\ncert x u\n", "line 2: the same credential"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[256] = "";
        mg_auth *a = parse(bad[i].text, err);
        CU_ASSERT_PTR_NULL(a);
        if (strncmp(err, bad[i].err, strlen(bad[i].err)) != 0) {
            fprintf(stderr, "case %zu: \"%s\" does not start with \"%s\"\n", i, err, bad[i].err);
            CU_FAIL("error message");
        }
        mg_auth_free(a);
    }
    {
        char text[2100], err[256];
        memset(text, 'a', sizeof(text) - 1);
        text[sizeof(text) - 1] = '\0';
        CU_ASSERT_PTR_NULL(parse(text, err));
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "line 1: longer than"));
        CU_ASSERT_PTR_NULL(mg_auth_parse("cert x t\0\n", 10, err, sizeof(err)));
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "NUL"));
    }
}

static void test_tenant_names(void)
{
    char long_name[MG_TENANT_MAX + 2];
    CU_ASSERT_TRUE(mg_tenant_ok("team-a.b_c:1", 12));
    CU_ASSERT_FALSE(mg_tenant_ok("", 0));
    CU_ASSERT_FALSE(mg_tenant_ok("a b", 3));
    CU_ASSERT_FALSE(mg_tenant_ok("a@b", 3));
    memset(long_name, 'x', sizeof(long_name));
    CU_ASSERT_TRUE(mg_tenant_ok(long_name, MG_TENANT_MAX));
    CU_ASSERT_FALSE(mg_tenant_ok(long_name, MG_TENANT_MAX + 1));
}

static void test_empty_file_is_an_empty_table(void)
{
    char err[256];
    mg_auth *a = parse("# nobody yet\n\n", err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    CU_ASSERT_EQUAL(mg_auth_count(a), 0);
    mg_auth_free(a);
}

int main(void)
{
    static const mg_test_case cases[] = {MG_TEST(test_lookups), MG_TEST(test_errors_name_the_line),
                                         MG_TEST(test_tenant_names),
                                         MG_TEST(test_empty_file_is_an_empty_table)};
    return mg_test_run("auth", cases, sizeof(cases) / sizeof(cases[0]));
}
