/* Unit tests for mg_config: defaults, file < environment < flags, limits, clear errors. */
#include "mg_config.h"
#include "mg_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int load(mg_config *c, char *err, int argc, char **argv)
{
    FILE *devnull = fopen("/dev/null", "w");
    int rc = mg_config_load(c, argc, argv, devnull, err, 512);
    fclose(devnull);
    return rc;
}

static void test_defaults(void)
{
    mg_config c;
    char err[512];
    char *argv[] = {"moongate"};
    CU_ASSERT_EQUAL(load(&c, err, 1, argv), MG_CONFIG_OK);
    CU_ASSERT_STRING_EQUAL(c.listen, "[::]:7443");
    CU_ASSERT_STRING_EQUAL(c.ops_listen, "[::]:7080");
    CU_ASSERT_EQUAL(c.max_message_bytes, 4 * 1024 * 1024);
    CU_ASSERT_EQUAL(c.max_concurrent_streams, 100);
    CU_ASSERT_EQUAL(c.grace, 30);
    CU_ASSERT_EQUAL(c.debug_service, 0);
    CU_ASSERT_EQUAL(c.access_log, 1);
    CU_ASSERT_EQUAL(c.unix_socket_mode, 0660);
    CU_ASSERT_EQUAL(c.tcp_send_buffer, MG_CONFIG_AUTO);
    mg_config_free(&c);
}

static void test_precedence_file_env_flag(void)
{
    mg_config c;
    char err[512], path[] = "/tmp/mgcfgXXXXXX";
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    char arg_config[64];
    fprintf(f, "# comment\nworkers = 3\nqueue-depth = 9\nmax-message-bytes = \"1M\"\n"
               "log-level = debug\n");
    fclose(f);
    snprintf(arg_config, sizeof(arg_config), "--config=%s", path);
    setenv("MOONGATE_QUEUE_DEPTH", "10", 1);
    setenv("MOONGATE_GRACE", "5", 1);
    {
        char *argv[] = {"moongate", arg_config,        "--grace",
                        "7",        "--debug-service", "--unix-socket-mode=0666"};
        CU_ASSERT_EQUAL(load(&c, err, 6, argv), MG_CONFIG_OK);
    }
    CU_ASSERT_EQUAL(c.workers, 3);      /* file */
    CU_ASSERT_EQUAL(c.queue_depth, 10); /* env beats file */
    CU_ASSERT_EQUAL(c.grace, 7);        /* flag beats env */
    CU_ASSERT_EQUAL(c.max_message_bytes, 1024 * 1024);
    CU_ASSERT_STRING_EQUAL(c.log_level, "debug");
    CU_ASSERT_EQUAL(c.debug_service, 1);
    CU_ASSERT_EQUAL(c.unix_socket_mode, 0666);
    mg_config_free(&c);
    unsetenv("MOONGATE_QUEUE_DEPTH");
    unsetenv("MOONGATE_GRACE");
    unlink(path);
}

static void expect_error(const char *needle, int argc, char **argv)
{
    mg_config c;
    char err[512];
    CU_ASSERT_EQUAL(load(&c, err, argc, argv), MG_CONFIG_ERROR);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, needle));
    mg_config_free(&c);
}

static void test_errors(void)
{
    char *a1[] = {"moongate", "--workers", "0"};
    char *a2[] = {"moongate", "--workers=abc"};
    char *a3[] = {"moongate", "--no-such-flag"};
    char *a4[] = {"moongate", "--max-message-bytes", "4Q"};
    char *a5[] = {"moongate", "--tls-cert", "x.pem"};
    char *a6[] = {"moongate", "--grace"};
    char *a7[] = {"moongate", "--debug-service=maybe"};
    char *a8[] = {"moongate", "stray"};
    char *a9[] = {"moongate", "--max-message-bytes", "2G"};
    char *a10[] = {"moongate", "--unix-socket-mode", "0999"};
    char *a11[] = {"moongate", "--unix-socket-mode", "01777"};
    char *a12[] = {"moongate", "--tcp-send-buffer", "fast"};
    char *a13[] = {"moongate", "--workers", "auto"}; /* auto only where it is the default */
    char *a14[] = {"moongate", "--tcp-send-buffer", "2G"};
    expect_error("--workers=0 is outside 1..256", 3, a1);
    expect_error("whole number", 2, a2);
    expect_error("unknown option \"--no-such-flag\"", 2, a3);
    expect_error("size", 3, a4);
    expect_error("--tls-cert and --tls-key go together", 3, a5);
    expect_error("--grace needs a value", 2, a6);
    expect_error("true or false", 2, a7);
    expect_error("unexpected argument", 2, a8);
    expect_error("outside", 3, a9);
    expect_error("octal permissions", 3, a10);
    expect_error("octal permissions", 3, a11);
    expect_error("--tcp-send-buffer takes auto or a size such as 4M or 65536, not \"fast\"", 3,
                 a12);
    expect_error("--workers takes a whole number", 3, a13);
    expect_error("--tcp-send-buffer=2G is outside 0..1073741824", 3, a14);
}

static void test_size_or_auto(void)
{
    mg_config c;
    char err[512];
    char *fixed[] = {"moongate", "--tcp-send-buffer", "1M"};
    char *none[] = {"moongate", "--tcp-send-buffer=0"};
    char *aut[] = {"moongate", "--tcp-send-buffer", "auto", "--tcp-congestion", "bbr"};
    CU_ASSERT_EQUAL_FATAL(load(&c, err, 3, fixed), MG_CONFIG_OK);
    CU_ASSERT_EQUAL(c.tcp_send_buffer, 1048576);
    CU_ASSERT_EQUAL(c.data_tcp.send_buffer, 1048576); /* as the data plane takes it */
    mg_config_free(&c);
    CU_ASSERT_EQUAL_FATAL(load(&c, err, 2, none), MG_CONFIG_OK);
    CU_ASSERT_EQUAL(c.tcp_send_buffer, 0);
    CU_ASSERT_EQUAL(c.data_tcp.send_buffer, 0);
    mg_config_free(&c);
    CU_ASSERT_EQUAL_FATAL(load(&c, err, 5, aut), MG_CONFIG_OK);
    CU_ASSERT_EQUAL(c.tcp_send_buffer, MG_CONFIG_AUTO);
    CU_ASSERT_EQUAL(c.data_tcp.send_buffer, MG_DP_SEND_BUFFER_AUTO);
    CU_ASSERT_STRING_EQUAL(c.data_tcp.congestion, "bbr");
    mg_config_free(&c);
}

static void test_env_error_names_the_variable(void)
{
    char *argv[] = {"moongate"};
    setenv("MOONGATE_WORKERS", "many", 1);
    expect_error("environment MOONGATE_WORKERS", 1, argv);
    unsetenv("MOONGATE_WORKERS");
}

static void test_file_errors_name_the_line(void)
{
    char path[] = "/tmp/mgcfgXXXXXX", arg[64];
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "workers = 2\n\nbogus = 1\n");
    fclose(f);
    snprintf(arg, sizeof(arg), "--config=%s", path);
    {
        char *argv[] = {"moongate", arg};
        char needle[96];
        snprintf(needle, sizeof(needle), "%s line 3: unknown option \"bogus\"", path);
        expect_error(needle, 2, argv);
    }
    unlink(path);
    {
        char *argv[] = {"moongate", "--config", "/nonexistent/moongate.conf"};
        expect_error("/nonexistent/moongate.conf", 3, argv);
    }
}

static void test_sizes(void)
{
    uint64_t v;
    CU_ASSERT_EQUAL(mg_config_parse_size("4M", &v), 0);
    CU_ASSERT_EQUAL(v, 4194304);
    CU_ASSERT_EQUAL(mg_config_parse_size("16KiB", &v), 0);
    CU_ASSERT_EQUAL(v, 16384);
    CU_ASSERT_EQUAL(mg_config_parse_size("1g", &v), 0);
    CU_ASSERT_EQUAL(v, 1073741824);
    CU_ASSERT_EQUAL(mg_config_parse_size("123", &v), 0);
    CU_ASSERT_EQUAL(v, 123);
    CU_ASSERT_EQUAL(mg_config_parse_size("", &v), -1);
    CU_ASSERT_EQUAL(mg_config_parse_size("-1", &v), -1);
    CU_ASSERT_EQUAL(mg_config_parse_size("99999999999999999999G", &v), -1);
    CU_ASSERT_EQUAL(mg_config_parse_size("17179869184G", &v), -1); /* overflows 64 bits */
}

/* --advertise expands $(VAR) and $(VAR:dashed) from the environment (a pod's IP into its DNS
 * label); what cannot be expanded is an error naming the variable. */
static void test_advertise_expands_the_environment(void)
{
    mg_config c;
    char err[512];
    char *plain[] = {"moongate", "--advertise", "$(MG_T_IP):7443"};
    char *dashed[] = {"moongate", "--advertise", "$(MG_T_IP:dashed).peers.ns.svc:$(MG_T_PORT)"};
    char *v6[] = {"moongate", "--advertise", "[$(MG_T_IP6)]:7443/$(MG_T_IP6:dashed)"};
    char *unset[] = {"moongate", "--advertise", "$(MG_T_NOT_SET):7443"};
    char *open_[] = {"moongate", "--advertise", "$(MG_T_IP:7443"};
    char *form[] = {"moongate", "--advertise", "$(MG_T_IP:upper):7443"};
    setenv("MG_T_IP", "10.1.2.3", 1);
    setenv("MG_T_PORT", "7443", 1);
    setenv("MG_T_IP6", "fd00::1", 1);
    CU_ASSERT_EQUAL(load(&c, err, 3, plain), MG_CONFIG_OK);
    CU_ASSERT_STRING_EQUAL(c.advertise, "10.1.2.3:7443");
    mg_config_free(&c);
    CU_ASSERT_EQUAL(load(&c, err, 3, dashed), MG_CONFIG_OK);
    CU_ASSERT_STRING_EQUAL(c.advertise, "10-1-2-3.peers.ns.svc:7443");
    mg_config_free(&c);
    CU_ASSERT_EQUAL(load(&c, err, 3, v6), MG_CONFIG_OK);
    CU_ASSERT_STRING_EQUAL(c.advertise, "[fd00::1]:7443/fd00--1");
    mg_config_free(&c);
    CU_ASSERT_EQUAL(load(&c, err, 3, unset), MG_CONFIG_ERROR);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "$(MG_T_NOT_SET) names an environment variable"));
    mg_config_free(&c);
    CU_ASSERT_EQUAL(load(&c, err, 3, open_), MG_CONFIG_ERROR);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "without a variable and a )"));
    mg_config_free(&c);
    CU_ASSERT_EQUAL(load(&c, err, 3, form), MG_CONFIG_ERROR);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "the only form after ':' is dashed"));
    mg_config_free(&c);
    unsetenv("MG_T_IP");
    unsetenv("MG_T_PORT");
    unsetenv("MG_T_IP6");
}

static void test_help_lists_every_option_with_env(void)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    mg_config_help(f);
    fclose(f);
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "--max-message-bytes SIZE"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "MOONGATE_MAX_MESSAGE_BYTES"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "range 1..256"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "--grace"));
    free(buf);
}

int main(void)
{
    static const mg_test_case cases[] = {
        MG_TEST(test_defaults),
        MG_TEST(test_precedence_file_env_flag),
        MG_TEST(test_errors),
        MG_TEST(test_size_or_auto),
        MG_TEST(test_env_error_names_the_variable),
        MG_TEST(test_file_errors_name_the_line),
        MG_TEST(test_sizes),
        MG_TEST(test_advertise_expands_the_environment),
        MG_TEST(test_help_lists_every_option_with_env),
    };
    return mg_test_run("configuration", cases, sizeof(cases) / sizeof(cases[0]));
}
