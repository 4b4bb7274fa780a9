/* SPDX-License-Identifier: MIT */
/*
 * outcome.c - the table behind a call's outcome (outcome.h): for each
 * kind, its text, its code and whose fault it usually is.
 */
#include "base/outcome.h"

#include <assert.h>

#include "util.h"

struct kind_info {
    const char *text;
    int rc;
    enum call_fault fault;
};

#define UP CALL_FAULT_UPSTREAM
#define GW CALL_FAULT_GATEWAY
#define CL CALL_FAULT_CLIENT

static const struct kind_info kinds[CALL_KIND_COUNT] = {
    [CALL_OK]                   = { "complete", 0, CALL_FAULT_NONE },
    [CALL_CONNECT]              = { "connect failed", GW_EUPSTREAM, UP },
    [CALL_TLS]                  = { "tls failed", GW_EUPSTREAM, UP },
    [CALL_CONNECT_TIMEOUT]      = { "connect timeout", GW_ETIMEDOUT, UP },
    [CALL_FIRST_BYTE_TIMEOUT]   = { "first byte timeout", GW_ETIMEDOUT, UP },
    [CALL_IDLE_TIMEOUT]         = { "idle timeout", GW_ETIMEDOUT, UP },
    [CALL_TOTAL_TIMEOUT]        = { "total timeout", GW_ETIMEDOUT, UP },
    [CALL_STATUS]               = { "retryable status", GW_EUPSTREAM, UP },
    [CALL_EMPTY_REPLY]          = { "empty reply", GW_EUPSTREAM, UP },
    [CALL_BAD_HEAD]             = { "bad response head", GW_EUPSTREAM, UP },
    [CALL_BAD_HEADER]           = { "bad response header", GW_EUPSTREAM, UP },
    [CALL_BAD_LENGTH]           = { "bad content-length", GW_EUPSTREAM, UP },
    [CALL_CONFLICTING_LENGTH]   = { "conflicting content-length",
                                    GW_EUPSTREAM, UP },
    [CALL_LENGTH_AND_CHUNKED]   = { "content-length with transfer-encoding",
                                    GW_EUPSTREAM, UP },
    [CALL_BAD_TRANSFER_ENCODING] = { "unsupported transfer-encoding",
                                     GW_EUPSTREAM, UP },
    [CALL_BAD_CONTENT_ENCODING] = { "unsupported content-encoding",
                                    GW_EUPSTREAM, UP },
    [CALL_HEAD_TOO_LARGE]       = { "response head too large",
                                    GW_EUPSTREAM, UP },
    [CALL_HEADER_TOO_LARGE]     = { "response header too large",
                                    GW_EUPSTREAM, UP },
    [CALL_STALE_408]            = { "408 on a kept connection",
                                    GW_EUPSTREAM, UP },
    [CALL_BROKEN]               = { "connection broken", GW_EUPSTREAM, UP },
    [CALL_CLIENT_GONE]          = { "its clients hung up", GW_EABORTED,
                                    CL },
    [CALL_TOO_BIG]              = { "response too large", GW_ETOOBIG, GW },
    [CALL_STOPPED]              = { "stopped by the gateway", GW_EIO, GW },
    [CALL_LOST_HEDGE]           = { "lost the hedge", GW_EABORTED,
                                    CALL_FAULT_NONE },
    [CALL_NOMEM]                = { "out of memory", GW_ENOMEM, GW },
    [CALL_STOPPING]             = { "gateway shutting down", GW_ESTOPPING,
                                    GW },
    [CALL_BAD_METHOD]           = { "unsupported method", GW_EINVAL, GW },
    [CALL_BAD_REQUEST_HEADER]   = { "invalid request header", GW_EINVAL, GW },
    [CALL_REQUEST_HEADERS_TOO_LARGE] = { "request headers too large",
                                         GW_ETOOBIG, GW },
    [CALL_BAD_URL]              = { "invalid request url", GW_EINVAL, GW },
    [CALL_OPTION_REFUSED]       = { "libcurl refused an option", GW_EINVAL,
                                    GW },
    [CALL_MULTI_FAILED]         = { "libcurl multi failure", GW_ENOMEM, GW },
    /* Ours: a bound the gateway keeps, not a failure of the upstream's
     * (the idle-close race), so no verdict on it and no retry. */
    [CALL_NOT_RESENT]           = { "connection closed before an answer, "
                                    "no attempt left to resend it",
                                    GW_EUPSTREAM, GW },
    [CALL_NO_UPSTREAM]          = { "no upstream available", GW_EUNAVAIL,
                                    GW },
    [CALL_ALL_FULL]             = { "every upstream is at max_inflight",
                                    GW_EUNAVAIL, GW },
    [CALL_NOT_SERVED]           = { "model not served", GW_ENOTFOUND, GW },
    [CALL_QUEUE_GONE]           = { "client gone while queued", GW_EABORTED,
                                    CL },
    [CALL_SHED]                 = { "every upstream is saturated",
                                    GW_ESHED, GW },
};

#undef UP
#undef GW
#undef CL

static const struct kind_info *
info(enum call_kind kind)
{
    assert((unsigned)kind < CALL_KIND_COUNT && kinds[kind].text != NULL);
    return &kinds[kind];
}

struct call_outcome
call_outcome_make(enum call_kind kind)
{
    struct call_outcome o = { kind, 0, 0, info(kind)->fault };

    return o;
}

int
call_kind_rc(enum call_kind kind)
{
    return info(kind)->rc;
}

enum call_fault
call_kind_fault(enum call_kind kind)
{
    return info(kind)->fault;
}

const char *
call_kind_text(enum call_kind kind)
{
    return info(kind)->text;
}

enum call_kind
call_kind_of_stop(int rc)
{
    switch (rc) {
    case GW_EABORTED:  return CALL_CLIENT_GONE;
    case GW_ENOMEM:    return CALL_NOMEM;
    case GW_ESTOPPING: return CALL_STOPPING;
    case GW_ETOOBIG:   return CALL_TOO_BIG;
    default:           return CALL_STOPPED;
    }
}

enum call_kind
call_kind_of_head(enum http_head_error e)
{
    switch (e) {
    case HTTP_HEAD_TOO_LARGE:           return CALL_HEAD_TOO_LARGE;
    case HTTP_HEAD_BAD_FIELD:           return CALL_BAD_HEADER;
    case HTTP_HEAD_BAD_LENGTH:          return CALL_BAD_LENGTH;
    case HTTP_HEAD_CONFLICTING_LENGTH:  return CALL_CONFLICTING_LENGTH;
    case HTTP_HEAD_LENGTH_AND_CHUNKED:  return CALL_LENGTH_AND_CHUNKED;
    case HTTP_HEAD_BAD_TRANSFER_CODING: return CALL_BAD_TRANSFER_ENCODING;
    case HTTP_HEAD_BAD_CONTENT_CODING:  return CALL_BAD_CONTENT_ENCODING;
    case HTTP_HEAD_OK:
    case HTTP_HEAD_BAD_STATUS:
        break;
    }
    return CALL_BAD_HEAD;
}

int
call_kind_is_timeout(enum call_kind kind)
{
    return info(kind)->rc == GW_ETIMEDOUT;
}
