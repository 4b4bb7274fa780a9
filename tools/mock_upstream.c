/* SPDX-License-Identifier: MIT */
/*
 * mock_upstream.c - a mock vLLM server speaking the OpenAI-compatible API,
 * with knobs for tests, demos and benchmarks.  docs/MOCK_UPSTREAM.md is its
 * specification.
 *
 * This file is the program: its command line and its accept loop.  The
 * rest is in tools/mock/, a file a job:
 *
 *   mock.h, mock.c  what the files share: limits, options, the state 'st'
 *                   and its lock, a connection and a request
 *   conn.c          the HTTP side: a thread a connection, routing,
 *                   counting, the access log
 *   post.c          a POST to a vLLM route: its body, knobs, hold, faults
 *   complete.c      the completions, streamed or whole
 *   vllm.c          the other vLLM routes and the probes
 *   control.c       /control, /metrics, /stats, /stats/reset, /release
 *                   and /gate
 *   record.c        what is remembered of requests: /recorded
 *   send.c          heads, bodies, chunks, events and errors on the wire
 *   wait.c          every wait, each watching the client
 *   engine.c        engine mode's vLLM-like engine
 *   lora.c          its LoRA adapters: slots, LRU, vllm:lora_requests_info
 *
 * Design: the main thread accepts; each connection gets a detached thread
 * (conn.c).  A request's waits (wait.c) watch its client, so a client
 * that goes away ends them at once.  mock.h says what is shared and
 * under which lock.
 *
 * Engine mode (-e, -E): completions are not paced by -d but by a vLLM-like
 * engine (mock/engine.h): a scheduler thread runs a continuous batch over
 * a FIFO, and each content chunk waits for its token.  The connection
 * thread submits its request after the hold, the first-byte delay and
 * the faults that answer at once, then polls the client socket and its
 * sequence's eventfd together, so a hang-up takes the sequence out of
 * the engine at once.  GET /metrics shows vLLM's series, the engine's or,
 * without it, the completions in progress.
 *
 * Signals: SIGTERM and SIGINT are blocked in every thread; the accept loop
 * waits in ppoll() with them unblocked, so the main thread alone takes
 * them.  It then exits 0 without waiting for connection threads: a mock
 * has nothing to drain, and tests want it gone promptly.
 */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "log.h"
#include "mock/conn.h"
#include "mock/engine.h"
#include "mock/lora.h"
#include "mock/mock.h"
#include "net.h"
#include "util.h"

#define MOCK_STACK_SIZE (512 * 1024)
#define MOCK_MAX_PREFIX (64 * 1024)         /* -p bytes */

static volatile sig_atomic_t stop_signal;

static void
usage(FILE *f)
{
    struct engine_params d;

    engine_params_init(&d);
    fprintf(f,
            "usage: mock_upstream [-l ADDR] [-n CHUNKS] [-f FIRST_MS] "
            "[-d DELAY_MS] [-m MODELS] [-s N:MS] [-p BYTES] [-e]\n"
            "                     [-E KEY=VALUE[,KEY=VALUE...]] "
            "[--max-loras N [--lora NAMES]\n"
            "                     [--lora-load-ms MS]] [-q] [-v] [-h]\n"
            "A mock vLLM OpenAI-compatible server for tests, demos and "
            "benchmarks.\n"
            "  -l ADDR  listen on HOST:PORT, port 0 picks one "
            "(default 127.0.0.1:8000)\n"
            "  -n N     content chunks per completion (default 8)\n"
            "  -f MS    delay before the first byte of a completion "
            "(default 0)\n"
            "  -d MS    delay between streamed chunks (default 0)\n"
            "  -m LIST  models GET /v1/models lists, comma-separated "
            "(default mock-model,llama-3-8b)\n"
            "  -s N:MS  every Nth completion waits MS more for its first "
            "byte\n"
            "  -p N     prompt bytes that make a prefix, for prefix_hits "
            "(default 256)\n"
            "  -e       engine mode: a vLLM-like continuous batch paces "
            "completions\n"
            "           (-n and -d then do not apply)\n"
            "  -E LIST  engine parameters, KEY=VALUE,... (implies -e); "
            "defaults:\n"
            "           max_running=%ld step_ms=%g step_per_seq_ms=%g "
            "prefill_us_per_token=%g\n"
            "           kv_blocks=%ld block_tokens=%ld "
            "default_max_tokens=%ld\n"
            "  --max-loras N     LoRA adapters a batch may hold (GPU slots), "
            "0..%d;\n"
            "                    0 (the default) is LoRA off; implies -e\n"
            "  --lora NAMES      the adapters served from the start, "
            "comma-separated,\n"
            "                    each a model whose parent is the first -m "
            "model\n"
            "  --lora-load-ms MS loading an adapter into a slot costs this "
            "(default %d)\n"
            "  -q       quiet: no log line per request\n"
            "  -v       log a gateway's probes and scrapes too (GET /health,"
            "\n           /v1/models and /metrics), which are left out "
            "otherwise\n"
            "  -h       this help\n"
            "Prints \"mock_upstream listening port=N\" when ready.  "
            "Endpoints, the engine and the\nrequest-body knobs "
            "(mock_chunks, mock_hold, mock_fault, ...) are in\n"
            "docs/MOCK_UPSTREAM.md.\n",
            d.max_running, (double)d.step_ns / 1e6,
            (double)d.step_per_seq_ns / 1e6,
            (double)d.prefill_ns_per_token / 1e3, d.kv_blocks,
            d.block_tokens, d.default_max_tokens, LORA_MAX_SLOTS,
            LORA_DEFAULT_LOAD_MS);
}

static void
on_signal(int sig)
{
    stop_signal = sig;
}

/*
 * Install the handlers and block SIGTERM/SIGINT; OUT *waitmask is the mask
 * the accept loop's ppoll() waits with (the same, with both unblocked).
 */
static int
signals_init(sigset_t *waitmask)
{
    struct sigaction sa;
    sigset_t block;
    int err;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_IGN;
    if (sigaction(SIGPIPE, &sa, NULL) == -1)
        return GW_EIO;
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;            /* no SA_RESTART: ppoll must return EINTR */
    if (sigaction(SIGTERM, &sa, NULL) == -1
        || sigaction(SIGINT, &sa, NULL) == -1)
        return GW_EIO;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    err = pthread_sigmask(SIG_BLOCK, &block, waitmask);
    if (err != 0)
        return GW_EIO;
    sigdelset(waitmask, SIGTERM);
    sigdelset(waitmask, SIGINT);
    return 0;
}

/* The long options: LoRA adapters (mock/lora.h). */
enum { OPT_MAX_LORAS = 256, OPT_LORA, OPT_LORA_LOAD_MS };

static const struct option long_opts[] = {
    { "max-loras", required_argument, NULL, OPT_MAX_LORAS },
    { "lora", required_argument, NULL, OPT_LORA },
    { "lora-load-ms", required_argument, NULL, OPT_LORA_LOAD_MS },
    { NULL, 0, NULL, 0 },
};

/*
 * --lora's list into opt.loras (split in place).  Returns 0, or 2 after
 * saying what is wrong.
 */
static int
parse_loras(char *list)
{
    char *tok, *next;

    for (tok = list; tok != NULL; tok = next) {
        next = strchr(tok, ',');
        if (next != NULL)
            *next++ = '\0';
        if (!lora_name_ok(tok) || opt.num_loras == LORA_MAX) {
            fprintf(stderr, "mock_upstream: --lora wants at most %d names "
                    "of 1 to %d printable ASCII bytes, comma-separated\n",
                    LORA_MAX, LORA_NAME_MAX);
            return 2;
        }
        opt.loras[opt.num_loras++] = tok;
    }
    return 0;
}

/* Parse the command line into 'opt'; returns -1 to go on, else an exit. */
static int
parse_args(int argc, char **argv)
{
    long ms;
    int ch;

    char *colon, *tok, *save = NULL, err[256];

    engine_params_init(&opt.engine_params);
    while ((ch = getopt_long(argc, argv, "l:n:f:d:m:s:p:eE:qvh", long_opts,
                             NULL)) != -1) {
        switch (ch) {
        case OPT_MAX_LORAS:
            if (gw_parse_long(optarg, 0, LORA_MAX_SLOTS,
                              &opt.engine_params.max_loras) != 0) {
                fprintf(stderr, "mock_upstream: --max-loras wants 0..%d\n",
                        LORA_MAX_SLOTS);
                return 2;
            }
            opt.engine |= opt.engine_params.max_loras > 0;
            break;
        case OPT_LORA:
            if (parse_loras(optarg) != 0)
                return 2;
            break;
        case OPT_LORA_LOAD_MS:
            if (gw_parse_long(optarg, 0, 60000, &ms) != 0) {
                fprintf(stderr, "mock_upstream: --lora-load-ms wants "
                        "0..60000\n");
                return 2;
            }
            opt.engine_params.lora_load_ns = (int64_t)ms * 1000000;
            break;
        case 'e':
            opt.engine = 1;
            break;
        case 'E':
            opt.engine = 1;
            if (engine_params_parse(&opt.engine_params, optarg, err,
                                    sizeof(err)) != 0) {
                fprintf(stderr, "mock_upstream: %s\n", err);
                return 2;
            }
            break;
        case 'l':
            opt.listen = optarg;
            break;
        case 'm':
            opt.num_models = 0;
            for (tok = strtok_r(optarg, ",", &save); tok != NULL;
                 tok = strtok_r(NULL, ",", &save)) {
                if (opt.num_models == MOCK_MAX_MODELS) {
                    fprintf(stderr, "mock_upstream: -m takes at most %d "
                            "models\n", MOCK_MAX_MODELS);
                    return 2;
                }
                opt.models[opt.num_models++] = tok;
            }
            break;
        case 's':
            colon = strchr(optarg, ':');
            if (colon != NULL)
                *colon = '\0';
            if (colon == NULL
                || gw_parse_long(optarg, 1, 1000000, &opt.slow_every) != 0
                || gw_parse_long(colon + 1, 0, MOCK_MAX_MS, &opt.slow_ms)
                   != 0) {
                fprintf(stderr, "mock_upstream: -s wants N:MS, every Nth "
                        "completion waits MS more for its first byte\n");
                return 2;
            }
            break;
        case 'p':
            if (gw_parse_long(optarg, 1, MOCK_MAX_PREFIX, &opt.prefix_bytes)
                != 0) {
                fprintf(stderr, "mock_upstream: -p wants 1..%d bytes\n",
                        MOCK_MAX_PREFIX);
                return 2;
            }
            break;
        case 'n':
            if (gw_parse_long(optarg, 0, MOCK_MAX_CHUNKS, &opt.chunks) != 0) {
                fprintf(stderr, "mock_upstream: -n wants 0..%d\n",
                        MOCK_MAX_CHUNKS);
                return 2;
            }
            break;
        case 'f':
        case 'd':
            if (gw_parse_long(optarg, 0, MOCK_MAX_MS,
                           ch == 'f' ? &opt.first_ms : &opt.delay_ms) != 0) {
                fprintf(stderr, "mock_upstream: -%c wants 0..%d ms\n", ch,
                        MOCK_MAX_MS);
                return 2;
            }
            break;
        case 'q':
            opt.quiet = 1;
            break;
        case 'v':
            opt.verbose = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc) {
        usage(stderr);
        return 2;
    }
    if (opt.num_loras > 0 && opt.engine_params.max_loras == 0) {
        fprintf(stderr, "mock_upstream: --lora needs --max-loras (LoRA is "
                "off without it, as vLLM's --lora-modules needs "
                "--enable-lora)\n");
        return 2;
    }
    return -1;
}

int
main(int argc, char **argv)
{
    pthread_attr_t attr;
    struct pollfd pfd;
    sigset_t waitmask;
    uint16_t port = 0;
    int lfd = -1, cfd, rc, n, err;

    rc = parse_args(argc, argv);
    if (rc >= 0)
        return rc;
    rc = 1;
    start_time = (double)time(NULL);
    json_object_seed(0);        /* before any thread uses jansson */
    if (mock_state_init() != 0 || signals_init(&waitmask) != 0) {
        fprintf(stderr, "mock_upstream: cannot initialise\n");
        return 1;
    }
    /* After signals_init(): the scheduler inherits the blocked signals. */
    if (opt.engine) {
        engine = engine_new(&opt.engine_params);
        if (engine == NULL || engine_start(engine) != 0) {
            fprintf(stderr, "mock_upstream: cannot start the engine\n");
            return 1;
        }
        for (size_t i = 0; i < opt.num_loras; i++) {
            if (engine_lora_add(engine, opt.loras[i], NULL) < 0) {
                fprintf(stderr, "mock_upstream: --lora names %s twice\n",
                        opt.loras[i]);
                return 2;
            }
        }
    }
    if (pthread_attr_init(&attr) != 0)
        return 1;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* Plenty for jansson at depth 64 and a 2 KiB log line, even under
     * ASan; thousands of benchmark connections stay cheap. */
    pthread_attr_setstacksize(&attr, MOCK_STACK_SIZE);

    if (net_listen(opt.listen, 1024, &lfd, &port) != 0)
        goto out;               /* net_listen logged why */
    printf("mock_upstream listening port=%u\n", (unsigned)port);
    fflush(stdout);

    while (!stop_signal) {
        pfd.fd = lfd;
        pfd.events = POLLIN;
        pfd.revents = 0;
        n = ppoll(&pfd, 1, NULL, &waitmask);
        if (n == -1) {
            err = errno;
            if (err == EINTR)
                continue;
            log_errno(GW_LOG_ERROR, err, "mock: ppoll");
            goto out;
        }
        for (;;) {
            rc = net_accept(lfd, &cfd);
            if (rc == GW_EAGAIN)
                break;
            if (rc != 0) {
                /* EMFILE and friends: back off instead of spinning. */
                err = errno;
                log_errno(GW_LOG_ERROR, err, "mock: accept");
                poll(NULL, 0, 100);
                break;
            }
            conn_spawn(cfd, &attr);
        }
    }
    if (!opt.quiet)
        log_msg(GW_LOG_INFO, "mock: signal %d, exiting", (int)stop_signal);
    mock_lock();
    st.stopping = 1;
    pthread_cond_broadcast(&st.cv);
    mock_unlock();
    rc = 0;

out:
    engine_stop(engine);
    if (lfd != -1)
        close(lfd);
    pthread_attr_destroy(&attr);
    return rc;
}
