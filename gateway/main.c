/* SPDX-License-Identifier: MIT */
/*
 * main.c - arguments, signals, startup and shutdown order.
 *
 * Order matters: global library set-up (curl_global_init, jansson's hash
 * seed) and the signal mask happen here, before any thread exists, so every
 * thread inherits SIGHUP/SIGINT/SIGTERM blocked and only the signalfd sees
 * them.
 */
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "coalesce/coalesce.h"
#include "base/config.h"
#include "client/generation.h"
#include "log.h"
#include "base/metrics.h"
#include "client/server.h"
#include "base/tenant.h"

/*
 * After the stop, how long connection threads get to end their streams
 * the defined way.  Every wait they can be in ends at the stop (an
 * upstream transfer's loop watches the stop pipe too; a health probe
 * hears of it within a second); this is the margin.
 */
#define STOP_GRACE_MS 5000

#ifndef INFERGW_DEFAULT_CONF
#define INFERGW_DEFAULT_CONF "/usr/local/etc/infergw/gateway.conf"
#endif

static void
usage(FILE *out)
{
    fprintf(out,
            "usage: infergw [-c FILE] [-t] [-h] [-V]\n"
            "  -c FILE  configuration file (default %s)\n"
            "  -t       check the configuration and exit (0 ok, 2 bad)\n"
            "  -h       this help\n"
            "  -V       print the version\n",
            INFERGW_DEFAULT_CONF);
}

/* 0, or the errno value of what failed. */
static int
block_signals(int *sig_fd)
{
    sigset_t set;
    int rc;

    signal(SIGPIPE, SIG_IGN);   /* writes use MSG_NOSIGNAL; curl too */
    sigemptyset(&set);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    rc = pthread_sigmask(SIG_BLOCK, &set, NULL);    /* no errno: its own */
    if (rc != 0)
        return rc;
    *sig_fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    return *sig_fd == -1 ? errno : 0;
}

int
main(int argc, char **argv)
{
    const char *path = INFERGW_DEFAULT_CONF;
    struct gw_config cfg;
    struct generations *gens = NULL;
    struct coalescer *co = NULL;
    struct tenants *tenants = NULL;
    struct server srv;
    char err[512];
    int test_only = 0, sig_fd = -1, opt, rc;

    while ((opt = getopt(argc, argv, "c:thV")) != -1) {
        switch (opt) {
        case 'c': path = optarg; break;
        case 't': test_only = 1; break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("infergw %s\n", INFERGW_VERSION); return 0;
        default:  usage(stderr); return 2;
        }
    }
    if (optind != argc) {
        usage(stderr);
        return 2;
    }
    if (generation_load_config(path, &cfg, err, sizeof(err)) != 0) {
        fprintf(stderr, "infergw: %s\n", err);
        return 2;
    }
    if (test_only) {
        printf("infergw: configuration file %s is valid\n", path);
        config_release(&cfg);
        return 0;
    }
    /* From here on every line is in the configured format; a config
     * error above went out as plain text, since no format was known. */
    log_set_level(cfg.log_level);
    log_set_format(cfg.log_format);

    rc = block_signals(&sig_fd);
    if (rc != 0) {
        log_errno(GW_LOG_ERROR, rc, "main: cannot set up the signals");
        return 1;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        log_msg(GW_LOG_ERROR, "main: curl_global_init failed");
        return 1;
    }
    json_object_seed(0);
    metrics_start(INFERGW_VERSION);

    co = coalescer_new(&cfg);
    tenants = tenants_new();
    if (co == NULL || tenants == NULL) {
        log_msg(GW_LOG_ERROR, "main: out of memory at startup");
        return 1;
    }
    gens = generations_new(&cfg);   /* takes cfg; starts the health beat */
    if (gens == NULL)
        return 1;
    if (server_init(&srv, gens, co, tenants) != 0
        || server_listen(&srv) != 0)
        return 1;
    log_msg(GW_LOG_INFO, "main: infergw %s started config=%s upstreams=%zu "
            "balance=%s", INFERGW_VERSION, path,
            generation_current(gens)->cfg.num_upstreams,
            config_balance_name(generation_current(gens)->cfg.balance));
    if (server_run(&srv, sig_fd) != 0)
        return 1;
    rc = server_drain(&srv, sig_fd);
    if (rc == GW_EABORTED) {
        /*
         * A second signal: the operator wants out now.  Threads are still
         * running on the objects below, so nothing is freed.  Exit status
         * 1 says requests were cut.
         */
        _exit(1);
    }
    if (rc == GW_ETIMEDOUT) {
        /*
         * drain_timeout passed: stop.  Every open stream ends the defined
         * way (SSE error event, no clean end; or a 503) before we exit,
         * never mid-write.
         */
        server_stop(&srv);
        if (server_wait(&srv, STOP_GRACE_MS) != 0) {
            log_msg(GW_LOG_ERROR, "main: connection threads still running "
                    "%d ms after the stop, exiting anyway", STOP_GRACE_MS);
            _exit(1);
        }
    }
    server_release(&srv);
    generations_free(gens);
    coalescer_free(co);
    tenants_free(tenants);
    curl_global_cleanup();
    close(sig_fd);
    log_msg(GW_LOG_INFO, "main: exit status=%d", rc != 0);
    return rc != 0;
}
